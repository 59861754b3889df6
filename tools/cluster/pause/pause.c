/* The pod sandbox's process for kubedev's real-cluster tests: it holds the pod's namespaces
 * and waits, reaping children, until SIGTERM or SIGINT ends it. Built static (cc -static) into
 * the sandbox image `cargo xtask cluster` imports, since no image can be pulled. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {.sa_handler = leave};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) {
        pause();
    }
    return EXIT_FAILURE;
}
