//! What the stores that speak TLS through rustls share.

/// Installs rustls's ring provider unless the process has one: rustls needs
/// a process-wide provider, and one the application installed stays.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
