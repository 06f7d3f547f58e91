//! The URLs of a Redis Cluster (`redis+cluster://`) and of a Sentinel group
//! (`redis+sentinel://`), each with its TLS form (`rediss+...`), read into
//! what the connection needs.

use ::redis::ConnectionAddr;

use crate::error::StoreError;
use crate::store::common::redact::redact;

/// The node URLs of `redis+cluster://[[user]:password@]host:port[,host:port...]`
/// (`rediss+cluster://` for TLS): `redis://[..@]host:port` each, the
/// credentials on every one. `None` for a URL of another scheme.
pub(super) fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>, StoreError> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
        ("rediss", rest)
    } else {
        return Ok(None);
    };
    let invalid = |why: &str| -> StoreError {
        format!(
            "invalid Redis Cluster URL `{}`: {why}; expected redis+cluster://host:port[,host:port...]",
            redact(url)
        )
        .into()
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(invalid("a path (a cluster has only database 0)"));
    }
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
    hosts
        .split(',')
        .map(|host| {
            host_port(host, "node").map_err(|why| invalid(&why))?;
            Ok(format!("{scheme}://{userinfo}{host}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The host and port of `host:port` in a URL's list of a `what` (a node,
/// a Sentinel), or what is wrong with it.
fn host_port<'a>(host: &'a str, what: &str) -> Result<(&'a str, u16), String> {
    let (name, port) = host
        .rsplit_once(':')
        .ok_or_else(|| format!("a {what} without a port"))?;
    if name.is_empty() {
        return Err(format!("a {what} without a host"));
    }
    let port = port
        .parse()
        .map_err(|_| "a port that is not a number".to_owned())?;
    Ok((name, port))
}

/// `redis+sentinel://[[user]:password@]host:port[,host:port...]/master[/db]`,
/// or `rediss+sentinel://...` for TLS to the Sentinels and to the master
/// alike.
#[derive(Debug, PartialEq)]
pub(super) struct SentinelUrl {
    pub(super) sentinels: Vec<ConnectionAddr>,
    /// Whether every connection (to a Sentinel, to the master) is TLS.
    pub(super) tls: bool,
    pub(super) master: String,
    pub(super) db: i64,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

impl SentinelUrl {
    /// `None` for a URL of another scheme.
    pub(super) fn parse(url: &str) -> Result<Option<SentinelUrl>, StoreError> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else {
            return Ok(None);
        };
        let scheme = if tls {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        let invalid = |why: &str| -> StoreError {
            format!(
                "invalid Sentinel URL `{}`: {why}; expected {scheme}://host:port[,host:port...]/master-name[/db]",
                redact(url)
            )
            .into()
        };
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| invalid("no master name"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => (
                    (!user.is_empty()).then(|| user.to_owned()),
                    Some(password.to_owned()),
                ),
                None => (Some(userinfo.to_owned()), None),
            },
        };
        let sentinels = hosts
            .split(',')
            .map(|host| {
                let (name, port) = host_port(host, "Sentinel").map_err(|why| invalid(&why))?;
                Ok::<_, StoreError>(match tls {
                    false => ConnectionAddr::Tcp(name.to_owned(), port),
                    true => ConnectionAddr::TcpTls {
                        host: name.to_owned(),
                        port,
                        insecure: false,
                        tls_params: None,
                    },
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (master, db) = match path.split_once('/') {
            Some((master, db)) => (
                master,
                db.parse()
                    .map_err(|_| invalid("a database that is not a number"))?,
            ),
            None => (path, 0),
        };
        if master.is_empty() {
            return Err(invalid("no master name"));
        }
        Ok(Some(SentinelUrl {
            sentinels,
            tls,
            master: master.to_owned(),
            db,
            username,
            password,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_every_node_with_the_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://:pw@a:1,b:2/").unwrap(),
            Some(vec![
                "redis://:pw@a:1".to_owned(),
                "redis://:pw@b:2".to_owned()
            ])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://a:1").unwrap(),
            Some(vec!["rediss://a:1".to_owned()])
        );
        assert_eq!(cluster_nodes("redis://a:1").unwrap(), None);
        for bad in [
            "redis+cluster://:secret@a",
            "redis+cluster://:secret@a:1/2",
            "redis+cluster://:secret@:1",
            "redis+cluster://:secret@a:1,b:x",
        ] {
            let err = cluster_nodes(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid Redis Cluster URL"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn sentinel_urls_name_hosts_master_database_and_password() {
        let url = SentinelUrl::parse("redis+sentinel://:pw@a:1,b:2/shop/3")
            .unwrap()
            .unwrap();
        assert_eq!(
            url,
            SentinelUrl {
                sentinels: vec![
                    ConnectionAddr::Tcp("a".into(), 1),
                    ConnectionAddr::Tcp("b".into(), 2)
                ],
                tls: false,
                master: "shop".into(),
                db: 3,
                username: None,
                password: Some("pw".into()),
            }
        );
        let tls = SentinelUrl::parse("rediss+sentinel://a:1/shop")
            .unwrap()
            .unwrap();
        assert!(tls.tls);
        assert!(matches!(
            &tls.sentinels[..],
            [ConnectionAddr::TcpTls { host, port: 1, insecure: false, .. }] if host == "a"
        ));
        assert!(SentinelUrl::parse("redis://a:1").unwrap().is_none());
        assert!(SentinelUrl::parse("rediss://a:1").unwrap().is_none());
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a/shop",
            "redis+sentinel://a:x/shop",
            "redis+sentinel://a:1/",
            "redis+sentinel://:secret@a:1/shop/x",
        ] {
            let err = SentinelUrl::parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid Sentinel URL"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
