//! Passwords taken out of connection strings, for errors and `Debug`.

/// The URL with any password replaced by `***`, for logs and `Debug`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        // A `key=value` connection string (PostgreSQL's other form).
        return url
            .split(' ')
            .map(|part| match part.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => part.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://:hunter2@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("redis://app:hunter2@host/1"),
            "redis://app:***@host/1"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(
            redact("postgres://app:hunter2@db:5432/shop"),
            "postgres://app:***@db:5432/shop"
        );
        assert_eq!(
            redact("host=db user=app password=hunter2 dbname=shop"),
            "host=db user=app password=*** dbname=shop"
        );
    }
}
