//! Opening sessions: plainly, or through the TLS connector a user gave.
//!
//! `tokio-postgres` takes the TLS implementation as a type parameter; the
//! store erases it here, so that no TLS stack enters this crate's
//! dependencies and the rest of the store is not generic.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, Error, NoTls, Socket};

use crate::store::BoxFuture;

/// What a session's connection delivers besides replies: notifications and
/// notices; `None` once it ended.
pub(super) type Messages =
    Box<dyn FnMut(&mut Context<'_>) -> Poll<Option<Result<AsyncMessage, Error>>> + Send>;

type OpenFn = dyn Fn(Config) -> BoxFuture<'static, Result<(Client, Messages), Error>> + Send + Sync;

/// Opens sessions to the server, with or without TLS.
#[derive(Clone)]
pub(super) struct Opener {
    open: Arc<OpenFn>,
    tls: bool,
}

impl Opener {
    /// Plain TCP.
    pub(super) fn plain() -> Opener {
        Opener::new(NoTls, false)
    }

    /// Through `tls` (`postgres-openssl`'s or `tokio-postgres-rustls`'s
    /// connector, say).
    pub(super) fn tls<T>(tls: T) -> Opener
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Opener::new(tls, true)
    }

    fn new<T>(tls: T, is_tls: bool) -> Opener
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let open = move |config: Config| -> BoxFuture<'static, Result<(Client, Messages), Error>> {
            let tls = tls.clone();
            Box::pin(async move {
                let (client, mut connection) = config.connect(tls).await?;
                let messages: Messages = Box::new(move |cx| connection.poll_message(cx));
                Ok((client, messages))
            })
        };
        Opener {
            open: Arc::new(open),
            tls: is_tls,
        }
    }

    /// Opens one session.
    pub(super) async fn open(&self, config: &Config) -> Result<(Client, Messages), Error> {
        (self.open)(config.clone()).await
    }
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "tls" } else { "plain" })
    }
}
