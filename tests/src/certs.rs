//! Throwaway TLS certificates for the servers the tests start.

use std::path::PathBuf;
use std::process::Command;

/// A throwaway certificate authority and the certificates it signed, for a
/// server (etcd, Redis) that serves TLS on `127.0.0.1` and may ask clients
/// for a certificate. Made with the `openssl` command; its directory is
/// removed when it is dropped.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TestCerts {
    /// A CA, a server certificate for `127.0.0.1` and a client
    /// certificate it signed, and a second CA that signed nothing of this.
    pub fn make(dir: PathBuf) -> TestCerts {
        std::fs::create_dir_all(&dir).expect("create the certificates' directory");
        let certs = TestCerts { dir };
        for ca in ["ca", "other-ca"] {
            certs.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN=lock-tests {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
            ]);
        }
        for (name, extensions) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(certs.dir.join(format!("{name}.ext")), extensions)
                .expect("write the extensions");
            certs.openssl(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN=lock-tests {name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            certs.openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ]);
        }
        certs
    }

    fn openssl(&self, args: &[&str]) {
        let made = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("run openssl (apt-get install -y openssl)");
        assert!(
            made.status.success(),
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&made.stderr)
        );
    }

    /// The path of `name` (`ca.crt`, `server.key`, ...).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The contents of `name` (`ca.crt`, `client.crt`, `client.key`,
    /// `other-ca.crt`, ...).
    pub fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).expect("read a certificate")
    }
}
