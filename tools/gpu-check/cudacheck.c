/*
 * kubedev GPU check: runs CUDA work on every GPU a container can see, using only what the
 * container's dynamic loader finds. It loads libcuda.so.1 by its SONAME (as the CUDA runtime
 * does), lists the devices, allocates memory, JIT-compiles a PTX kernel (which needs
 * libnvidia-ptxjitcompiler from the driver), runs it and checks the result.
 *
 * Build: cc -O2 -o cudacheck cudacheck.c -ldl   (no CUDA headers needed)
 * Exit status 0 when every step succeeded on at least one GPU.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

static const char *PTX =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r2, [n];\n"
    "  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.u32 %p1, %r1, %r2;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r1, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r3, [%rd4];\n"
    "  add.s32 %r3, %r3, 1;\n"
    "  st.global.u32 [%rd4], %r3;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

#define N 4096

static void *lib;

static void *sym(const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "FAIL: libcuda has no %s\n", name);
        exit(3);
    }
    return f;
}

#define CHECK(call, what)                                                 \
    do {                                                                  \
        CUresult r_ = (call);                                             \
        if (r_ != 0) {                                                    \
            const char *s_ = "?";                                         \
            if (getErrorString) getErrorString(r_, &s_);                  \
            fprintf(stderr, "FAIL: %s: error %d (%s)\n", what, r_, s_);   \
            return 1;                                                     \
        }                                                                 \
    } while (0)

int main(void) {
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "FAIL: dlopen libcuda.so.1: %s\n", dlerror());
        return 2;
    }
    CUresult (*getErrorString)(CUresult, const char **) = dlsym(lib, "cuGetErrorString");
    CUresult (*init)(unsigned) = sym("cuInit");
    CUresult (*driverVersion)(int *) = sym("cuDriverGetVersion");
    CUresult (*count)(int *) = sym("cuDeviceGetCount");
    CUresult (*get)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*name)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*mem)(size_t *, CUdevice) = sym("cuDeviceTotalMem_v2");
    CUresult (*ctxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
    CUresult (*ctxDestroy)(CUcontext) = sym("cuCtxDestroy_v2");
    CUresult (*alloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*memFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = sym("cuMemcpyHtoD_v2");
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    CUresult (*load)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*getFn)(CUfunction *, CUmodule, const char *) = sym("cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void *, void **, void **) = sym("cuLaunchKernel");
    CUresult (*sync)(void) = sym("cuCtxSynchronize");

    CHECK(init(0), "cuInit");
    int dv = 0, n = 0;
    CHECK(driverVersion(&dv), "cuDriverGetVersion");
    CHECK(count(&n), "cuDeviceGetCount");
    printf("CUDA driver API %d.%d, %d device(s)\n", dv / 1000, (dv % 1000) / 10, n);
    if (n < 1) {
        fprintf(stderr, "FAIL: no CUDA device visible\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        CUdevice d;
        char nm[256] = {0};
        size_t total = 0;
        CHECK(get(&d, i), "cuDeviceGet");
        CHECK(name(nm, sizeof nm, d), "cuDeviceGetName");
        CHECK(mem(&total, d), "cuDeviceTotalMem");
        CUcontext ctx;
        CHECK(ctxCreate(&ctx, 0, d), "cuCtxCreate");
        unsigned *host = malloc(N * sizeof *host);
        for (unsigned k = 0; k < N; k++) host[k] = k;
        CUdeviceptr buf;
        CHECK(alloc(&buf, N * sizeof *host), "cuMemAlloc");
        CHECK(htod(buf, host, N * sizeof *host), "cuMemcpyHtoD");
        CUmodule m;
        CHECK(load(&m, PTX), "cuModuleLoadData (PTX JIT)");
        CUfunction f;
        CHECK(getFn(&f, m, "add_one"), "cuModuleGetFunction");
        unsigned cnt = N;
        void *args[] = {&buf, &cnt};
        CHECK(launch(f, N / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), "cuLaunchKernel");
        CHECK(sync(), "cuCtxSynchronize");
        memset(host, 0, N * sizeof *host);
        CHECK(dtoh(host, buf, N * sizeof *host), "cuMemcpyDtoH");
        for (unsigned k = 0; k < N; k++) {
            if (host[k] != k + 1) {
                fprintf(stderr, "FAIL: element %u is %u, expected %u\n", k, host[k], k + 1);
                return 1;
            }
        }
        CHECK(memFree(buf), "cuMemFree");
        CHECK(ctxDestroy(ctx), "cuCtxDestroy");
        free(host);
        printf("OK device %d: %s, %zu MiB, %d-element kernel result correct\n", i, nm,
               total >> 20, N);
    }
    return 0;
}
