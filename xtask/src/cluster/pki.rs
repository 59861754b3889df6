//! Certificates, keys and kubeconfigs of one cluster run, made with the `openssl` command: one
//! CA, a serving certificate per server, a client certificate per component, and the service
//! accounts' signing key. Every name and address is loopback, but the API server's: the host's
//! address on the pods' bridge.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The node's name: the kubelet's `--hostname-override`, and the `nodeName` of kubedev's
/// slices.
pub(crate) const NODE: &str = "kubedev-node";

/// The API server's address, as every client reaches it: the host's on the pods' bridge
/// ([`network::HOST`](super::network::HOST)), so pods reach it too.
pub(crate) const SERVER: &str = "https://10.244.0.1:6443";

/// A certificate and its key.
#[derive(Debug, Clone)]
pub(crate) struct Pair {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// Everything the components authenticate with.
#[derive(Debug, Clone)]
pub(crate) struct Pki {
    pub(crate) ca: Pair,
    pub(crate) apiserver: Pair,
    pub(crate) apiserver_kubelet_client: Pair,
    pub(crate) kubelet_serving: Pair,
    /// The service accounts' signing key (private) and its public half.
    pub(crate) sa_key: PathBuf,
    pub(crate) sa_pub: PathBuf,
    /// kubeconfigs: the administrator (`system:masters`), and each component's.
    pub(crate) admin: PathBuf,
    pub(crate) controller_manager: PathBuf,
    pub(crate) scheduler: PathBuf,
    pub(crate) kubelet: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running openssl (Debian package openssl): the cluster's certificates need it")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Makes a new key and a certificate signed by the CA in `dir`, with `subject` and, when
/// given, `sans` (`IP:127.0.0.1,DNS:localhost`); it serves and authenticates clients.
fn leaf(dir: &Path, name: &str, subject: &str, sans: Option<&str>) -> anyhow::Result<Pair> {
    let ext = dir.join(format!("{name}.ext"));
    let mut text = String::from(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
    );
    if let Some(sans) = sans {
        text.push_str(&format!("subjectAltName={sans}\n"));
    }
    std::fs::write(&ext, text)?;
    let (key, csr, cert) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "7",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &cert,
        ],
    )?;
    Ok(Pair {
        cert: dir.join(cert),
        key: dir.join(key),
    })
}

/// Writes a kubeconfig at `path` for `user`, authenticated by `pair`, trusting the CA.
fn kubeconfig(path: &Path, ca: &Path, pair: &Pair, user: &str) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubedev\n  cluster:\n    server: {SERVER}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: {user}@kubedev\n  context:\n    cluster: kubedev\n    user: {user}\ncurrent-context: {user}@kubedev\n",
        ca = ca.display(),
        cert = pair.cert.display(),
        key = pair.key.display(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Generates a new PKI in `dir` (created; what was there is replaced).
pub(crate) fn generate(dir: &Path) -> anyhow::Result<Pki> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "7",
            "-subj",
            "/CN=kubedev-cluster-ca",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ],
    )?;
    let ca = Pair {
        cert: dir.join("ca.crt"),
        key: dir.join("ca.key"),
    };
    let apiserver = leaf(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        Some(
            "IP:127.0.0.1,IP:10.244.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local",
        ),
    )?;
    let apiserver_kubelet_client = leaf(
        dir,
        "apiserver-kubelet-client",
        "/O=system:masters/CN=kube-apiserver-kubelet-client",
        None,
    )?;
    let kubelet_serving = leaf(
        dir,
        "kubelet-serving",
        &format!("/CN={NODE}"),
        Some(&format!("IP:127.0.0.1,DNS:{NODE},DNS:localhost")),
    )?;
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "sa.key",
        ],
    )?;
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;

    let admin = dir.join("admin.kubeconfig");
    let pair = leaf(dir, "admin", "/O=system:masters/CN=kubernetes-admin", None)?;
    kubeconfig(&admin, &ca.cert, &pair, "kubernetes-admin")?;
    let controller_manager = dir.join("controller-manager.kubeconfig");
    let pair = leaf(
        dir,
        "controller-manager",
        "/CN=system:kube-controller-manager",
        None,
    )?;
    kubeconfig(
        &controller_manager,
        &ca.cert,
        &pair,
        "system:kube-controller-manager",
    )?;
    let scheduler = dir.join("scheduler.kubeconfig");
    let pair = leaf(dir, "scheduler", "/CN=system:kube-scheduler", None)?;
    kubeconfig(&scheduler, &ca.cert, &pair, "system:kube-scheduler")?;
    let kubelet = dir.join("kubelet.kubeconfig");
    let pair = leaf(
        dir,
        "kubelet",
        &format!("/O=system:nodes/CN=system:node:{NODE}"),
        None,
    )?;
    kubeconfig(&kubelet, &ca.cert, &pair, &format!("system:node:{NODE}"))?;
    Ok(Pki {
        ca,
        apiserver,
        apiserver_kubelet_client,
        kubelet_serving,
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
        admin,
        controller_manager,
        scheduler,
        kubelet,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_dial_the_api_server_on_the_pods_bridge() {
        let host = super::super::network::HOST.to_string();
        assert_eq!(SERVER, format!("https://{host}:6443"));
    }
}
