//! The lease table: its name, its creation, its statements, and a key's
//! row id.

use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use crate::error::StoreError;

/// One of the store's statements: its SQL and parameter types, and, on a
/// session of its own, the statement prepared from them. Without one
/// (behind a pooler in transaction mode), it is sent whole with every call.
pub(super) struct Stmt {
    pub(super) sql: String,
    pub(super) types: &'static [Type],
    pub(super) prepared: Option<Statement>,
}

pub(super) struct Statements {
    pub(super) acquire: Stmt,
    pub(super) refused: Stmt,
    pub(super) extend: Stmt,
    pub(super) release: Stmt,
    pub(super) hand_over: Stmt,
    pub(super) force_release: Stmt,
    pub(super) inspect: Stmt,
    pub(super) claim: Stmt,
    pub(super) unclaim: Stmt,
}

/// The lease table's name, checked, and its statements.
pub(super) struct Table {
    pub(super) name: String,
}

impl Table {
    pub(super) fn new(name: &str) -> Result<Table, StoreError> {
        let valid = !name.is_empty()
            && name.len() <= 50
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid table name `{name}`: letters, digits and `_`, at most 50 bytes, not starting with a digit"
            )
            .into());
        }
        Ok(Table {
            name: name.to_ascii_lowercase(),
        })
    }

    /// Creates the table, its sequence, the holders' table and the
    /// functions of shares and permits if any is missing (adding what a
    /// table made by an earlier version lacks), one process at a time.
    pub(super) async fn create(&self, client: &Client) -> Result<(), StoreError> {
        let t = &self.name;
        // Creating needs the right to create, even when the table exists:
        // a role that may only use it must not be asked to.
        // One round trip, unprepared: it works through any pooler. The
        // last function made stands for all of them.
        let (sequence, holders, force) = (
            format!("{t}_fencing"),
            format!("{t}_holders"),
            format!("{t}_force(bytea,text)"),
        );
        let exists: bool = client
            .query_typed(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL
                        AND to_regclass($3) IS NOT NULL AND to_regprocedure($4) IS NOT NULL",
                &[
                    (t, Type::TEXT),
                    (&sequence, Type::TEXT),
                    (&holders, Type::TEXT),
                    (&force, Type::TEXT),
                ],
            )
            .await
            .map_err(pg_error)?
            .first()
            .is_some_and(|row| row.get(0));
        if exists {
            return Ok(());
        }
        let sql = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('lock-runtime:{t}'));
             {schema}
             COMMIT;",
            schema = self.schema()
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|err| -> StoreError {
                format!(
                    "cannot create the lease table `{t}` (create it beforehand, see the docs): {}",
                    pg_error(err)
                )
                .into()
            })
    }

    /// The statements that make what the store needs, or add what a table
    /// made by an earlier version lacks; each does nothing when it is there.
    pub(super) fn schema(&self) -> String {
        let t = &self.name;
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 id bytea PRIMARY KEY,
                 key bytea NOT NULL,
                 token text NOT NULL,
                 fencing bigint NOT NULL,
                 expires_at timestamptz NOT NULL,
                 waiting boolean NOT NULL DEFAULT false,
                 writer_until timestamptz
             );
             ALTER TABLE {t} ADD COLUMN IF NOT EXISTS writer_until timestamptz;
             CREATE SEQUENCE IF NOT EXISTS {t}_fencing;
             CREATE TABLE IF NOT EXISTS {t}_holders (
                 id bytea NOT NULL,
                 token text NOT NULL,
                 fencing bigint NOT NULL,
                 expires_at timestamptz NOT NULL,
                 PRIMARY KEY (id, token)
             );
             {functions}",
            functions = include_str!("sql/claims.sql").replace("{t}", t),
        )
    }

    /// The statements, prepared on `client` when `prepare`.
    pub(super) async fn statements(
        &self,
        client: &Client,
        prepare: bool,
    ) -> Result<Statements, tokio_postgres::Error> {
        let make = async |sql: String, types: &'static [Type]| {
            let prepared = match prepare {
                true => Some(client.prepare_typed(&sql, types).await?),
                false => None,
            };
            Ok::<_, tokio_postgres::Error>(Stmt {
                sql,
                types,
                prepared,
            })
        };
        let t = &self.name;
        let remaining = "ceil(extract(epoch from (expires_at - clock_timestamp())) * 1000)::bigint";
        Ok(Statements {
            // $1 id, $2 key, $3 token, $4 ttl ms: the fencing value if
            // granted, no row if held. A repeat by the same token answers
            // as the first run did (same fencing). The statement a plain
            // lock table needs and no more: the common path pays for
            // nothing else.
            //
            // The key's turn first ($5, see `turn`), then the fencing
            // value: a statement that waits on the row (a release in
            // progress) keeps its turn, so no later statement on the key
            // takes a value, is granted and releases before this one
            // writes its earlier value.
            acquire: make(
                format!(
                    "WITH acquiring AS (SELECT pg_advisory_xact_lock(hashtext('{t}'), $5))
                     INSERT INTO {t} AS l (id, key, token, fencing, expires_at)
                     SELECT $1, $2, $3, nextval('{t}_fencing'),
                            clock_timestamp() + $4::bigint * interval '1 millisecond'
                     FROM acquiring
                     ON CONFLICT (id) DO UPDATE
                         SET token = excluded.token,
                             fencing = CASE WHEN l.token = excluded.token
                                            THEN l.fencing ELSE excluded.fencing END,
                             expires_at = excluded.expires_at,
                             waiting = l.waiting AND l.token = excluded.token
                         WHERE l.expires_at <= clock_timestamp() OR l.token = excluded.token
                     RETURNING fencing"
                ),
                &[Type::BYTEA, Type::BYTEA, Type::TEXT, Type::INT8, Type::INT4],
            )
            .await?,
            // $1 id, $2 mark: after a refusal (or to subscribe), the
            // holder's remaining time and what holds the row (a token, or
            // a share or permit claim), no row if there is no live holder
            // any more; marks the row when asked, so that its release
            // notifies. A marking caller is told of a holder only if the
            // row is marked: by this update (which waits for a release in
            // progress and then finds the row gone), or already (a release
            // then notifies). The row is not read from the statement's
            // snapshot: that could report a holder whose release, not yet
            // committed, had read `waiting` as false, and no notification
            // would come.
            //
            // $3: the caller is a writer that waits: a key held by shares
            // is marked so that no new share joins for 6 s (it asks again
            // well within that while it waits). A key held by a
            // semaphore's permits is a mismatch for it (`Claim::meets`):
            // answered, never marked.
            refused: make(
                format!(
                    "WITH marked AS (
                         UPDATE {t} SET waiting = waiting OR $2,
                             writer_until = CASE WHEN $3 AND token = '*shared'
                                 THEN clock_timestamp() + interval '6 s' ELSE writer_until END
                         WHERE id = $1 AND expires_at > clock_timestamp()
                             AND NOT ($3 AND token LIKE '*permits:%')
                             AND (($2 AND NOT waiting) OR ($3 AND token = '*shared'))
                         RETURNING {remaining}, token
                     )
                     (SELECT * FROM marked)
                     UNION ALL
                     (SELECT {remaining}, token FROM {t}
                      WHERE id = $1 AND expires_at > clock_timestamp()
                          AND (waiting OR NOT $2 OR ($3 AND token LIKE '*permits:%')))
                     LIMIT 1"
                ),
                &[Type::BYTEA, Type::BOOL, Type::BOOL],
            )
            .await?,
            // $1 id, $2 token, $3 ms: our lease ends that long from now (a
            // renewal by the ttl, a lingering release by what is left).
            extend: make(
                format!(
                    "UPDATE {t} SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
                     WHERE id = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING true"
                ),
                &[Type::BYTEA, Type::TEXT, Type::INT8],
            )
            .await?,
            // $1 id, $2 token, $3 channel. Notifies only if someone waits.
            release: make(
                format!(
                    "DELETE FROM {t}
                     WHERE id = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING (CASE WHEN waiting THEN pg_notify($3, encode(id, 'hex')) END) IS NULL"
                ),
                &[Type::BYTEA, Type::TEXT, Type::TEXT],
            )
            .await?,
            // $1 id, $2 token, $3 next token, $4 ttl ms, $5 the key's turn
            // (as in `acquire`).
            hand_over: make(
                format!(
                    "WITH handing_over AS (SELECT pg_advisory_xact_lock(hashtext('{t}'), $5))
                     UPDATE {t} SET token = $3, fencing = nextval('{t}_fencing'),
                         expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
                     FROM handing_over
                     WHERE id = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING fencing"
                ),
                &[Type::BYTEA, Type::TEXT, Type::TEXT, Type::INT8, Type::INT4],
            )
            .await?,
            // $1 id, $2 channel: every lease of the key deleted (see
            // sql/claims.sql).
            force_release: make(
                format!("SELECT {t}_force($1, $2)"),
                &[Type::BYTEA, Type::TEXT],
            )
            .await?,
            // $1 id: the live holder's token, fencing and remaining time
            // (of a key held by shares or permits, the latest grant's),
            // what holds it (a token, or '*shared', '*permits:N') and how
            // many leases.
            inspect: make(
                format!(
                    "SELECT coalesce(h.token, l.token), coalesce(h.fencing, l.fencing),
                            ceil(extract(epoch FROM (coalesce(h.expires_at, l.expires_at)
                                - clock_timestamp())) * 1000)::bigint,
                            l.token,
                            CASE WHEN left(l.token, 1) = '*' THEN
                                (SELECT count(*) FROM {t}_holders c
                                 WHERE c.id = l.id AND c.expires_at > clock_timestamp())
                            ELSE 1 END
                     FROM {t} l
                     LEFT JOIN LATERAL (
                         SELECT token, fencing, expires_at FROM {t}_holders h
                         WHERE h.id = l.id AND left(l.token, 1) = '*'
                             AND h.expires_at > clock_timestamp()
                         ORDER BY h.fencing DESC LIMIT 1
                     ) h ON true
                     WHERE l.id = $1 AND l.expires_at > clock_timestamp()"
                ),
                &[Type::BYTEA],
            )
            .await?,
            // See sql/claims.sql.
            claim: make(
                format!("SELECT answer, value, held FROM {t}_claim($1, $2, $3, $4, $5, $6, $7, $8)"),
                &[
                    Type::BYTEA,
                    Type::BYTEA,
                    Type::TEXT,
                    Type::INT8,
                    Type::TEXT,
                    Type::INT4,
                    Type::INT4,
                    Type::BOOL,
                ],
            )
            .await?,
            unclaim: make(
                format!("SELECT {t}_unclaim($1, $2, $3, $4, $5)"),
                &[Type::BYTEA, Type::TEXT, Type::INT8, Type::BOOL, Type::TEXT],
            )
            .await?,
        })
    }
}

/// The client's error with the server's own message, which its `Display`
/// leaves out ("db error").
pub(super) fn pg_error(err: tokio_postgres::Error) -> StoreError {
    match err.as_db_error() {
        Some(db) => format!("{err}: {db}").into(),
        None => StoreError::unavailable(err),
    }
}

/// The advisory lock a key's fencing values are drawn under (with the
/// table's name): the first four bytes of its row id. Keys that share them
/// only take turns.
pub(super) fn turn(id: &[u8]) -> i32 {
    let mut first = [0u8; 4];
    for (to, from) in first.iter_mut().zip(id) {
        *to = *from;
    }
    i32::from_be_bytes(first)
}

/// The row id of `key`: its SHA-256.
pub(super) fn row_id(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Lowercase hex, as PostgreSQL's `encode(.., 'hex')` writes it.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn table_names_are_checked() {
        assert!(Table::new("lock_leases").is_ok());
        assert_eq!(Table::new("Shop_Locks").unwrap().name, "shop_locks");
        for bad in ["", "1locks", "locks; DROP TABLE x", "a-b", &"x".repeat(51)] {
            let err = Table::new(bad).err().expect(bad).to_string();
            assert!(err.starts_with("invalid table name"), "{err}");
        }
    }

    #[test]
    pub(super) fn row_ids_are_the_keys_sha256_in_hex_as_postgres_writes_it() {
        assert_eq!(
            hex(&row_id("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
