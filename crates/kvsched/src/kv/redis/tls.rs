//! The TLS client settings of a tier: rustls with the ring provider, trusting the system's
//! roots or the certificates of a CA file. The CA file is read bounded: a regular file of at
//! most [`MAX_CA_BYTES`], opened without blocking (a FIFO or a device at the path is refused,
//! never waited on).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::config::ConfigError;
use crate::sync::Arc;

/// The largest CA file read, in bytes (a bundle of every public root is about 250 KiB).
pub const MAX_CA_BYTES: u64 = 4 << 20;

fn ca_error(path: &Path, problem: impl Into<String>) -> ConfigError {
    ConfigError::CaCert {
        path: PathBuf::from(path),
        problem: problem.into(),
    }
}

/// Reads the CA file: a regular file (symbolic links are followed) of at most
/// [`MAX_CA_BYTES`].
pub(crate) fn read_ca(path: &Path) -> Result<Vec<u8>, ConfigError> {
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading blocks until a writer comes; O_NONBLOCK does not.
        open.custom_flags(libc::O_NONBLOCK);
    }
    let mut file = open.open(path).map_err(|e| ca_error(path, e.to_string()))?;
    let meta = file.metadata().map_err(|e| ca_error(path, e.to_string()))?;
    if !meta.is_file() {
        return Err(ca_error(path, "not a regular file"));
    }
    if meta.len() > MAX_CA_BYTES {
        return Err(ca_error(
            path,
            format!(
                "{} bytes, over the {MAX_CA_BYTES} a CA file may hold",
                meta.len()
            ),
        ));
    }
    let mut pem = Vec::new();
    (&mut file)
        .take(MAX_CA_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| ca_error(path, e.to_string()))?;
    if pem.len() as u64 > MAX_CA_BYTES {
        return Err(ca_error(path, "grew past the size a CA file may hold"));
    }
    Ok(pem)
}

/// The client settings: roots from `ca` (PEM), or the system's.
pub(crate) fn client_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = read_ca(path)?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| ca_error(path, format!("bad PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| ca_error(path, format!("unusable certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(ca_error(path, "no PEM certificate in the file"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(ConfigError::Setting {
                    field: "tls",
                    problem: "no system root certificate found (name a CA file with ca=)",
                });
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| ConfigError::Setting {
            field: "tls",
            problem: "the TLS provider supports no protocol version",
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_path_that_is_a_device_a_fifo_or_huge_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        let big = dir.path().join("big.pem");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_CA_BYTES + 1)
            .unwrap();
        let mut paths = vec![PathBuf::from("/dev/zero"), big];
        if made.is_ok_and(|s| s.success()) {
            paths.push(fifo);
        }
        for p in paths {
            let t0 = std::time::Instant::now();
            let e = client_config(Some(&p)).err().map(|e| e.to_string());
            assert!(e.is_some(), "{p:?} accepted");
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(2),
                "{p:?}: {e:?}"
            );
        }
    }
}
