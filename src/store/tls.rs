//! TLS to etcd with etcd's own certificates: its CA (`--store-cacert`, as etcdctl's --cacert),
//! and a client certificate and key when the cluster asks for one (`--store-cert`,
//! `--store-key`). Nothing read from the files is ever printed.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The client configuration for a cluster whose CA is `ca`.
pub(super) fn config(ca: &Path, cert: Option<&Path>, key: Option<&Path>) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let cas = CertificateDer::pem_file_iter(ca).with_context(|| format!("--store-cacert {}", ca.display()))?;
    for c in cas {
        let c = c.with_context(|| format!("--store-cacert {}: not a PEM certificate", ca.display()))?;
        roots.add(c).with_context(|| format!("--store-cacert {}", ca.display()))?;
    }
    if roots.is_empty() {
        bail!("--store-cacert {}: no certificate in it", ca.display());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots);
    let config = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<_, _>>())
                .map_err(|_| anyhow::anyhow!("--store-cert {}: not a PEM certificate", cert.display()))?;
            if chain.is_empty() {
                bail!("--store-cert {}: no certificate in it", cert.display());
            }
            // The key's error never carries its bytes.
            let key = PrivateKeyDer::from_pem_file(key).map_err(|_| anyhow::anyhow!("--store-key {}: not a PEM private key", key.display()))?;
            builder.with_client_auth_cert(chain, key).context("the client certificate and key do not go together")?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => bail!("--store-cert and --store-key go together"),
    };
    Ok(Arc::new(config))
}
