//! The lease table's SQL: its tables and procedures, and the statements
//! the store sends, under a table name.
//!
//! Every time is the server's `UTC_TIMESTAMP(6)`, constant within a
//! statement; every answer is read from the OK packet's
//! `LAST_INSERT_ID` or a procedure's one row, never from affected-row
//! counts (which mean "found" or "changed" as the client's connection
//! flags say), except a `DELETE`'s.

use std::time::Duration;

use crate::error::StoreError;

/// What a refused acquire's `LAST_INSERT_ID` has set: the value then also
/// carries how the key is held (bits 32 to 61) and the holder's remaining
/// time (the low 32 bits, in microseconds, at most about 71 minutes).
/// Below 2^63, which is all a server in strict mode takes there; fencing
/// values (microseconds since 1970) stay far below it.
pub(super) const HELD: u64 = 1 << 62;

/// The largest kind a refusal carries: permits above it read as this many.
const MAX_KIND: u32 = (1 << 30) - 1;

/// Microseconds since the Unix epoch by the server's clock: where a key's
/// fencing values start, so that a key whose row was deleted (purged, lost
/// with the server's last commits) starts again above every value it had,
/// unless the server's clock was stepped back meanwhile.
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// How long a free key's row is kept before [`Statements::purge_find`]
/// finds it: far longer than any statement waits for a row lock
/// (`innodb_lock_wait_timeout`, 50 s by default), so that no statement
/// that read the clock before the key's last grant is still to write a
/// fencing value when the row goes.
pub(super) const KEPT_FREE_SECS: u32 = 600;

/// The most rows one purge deletes.
pub(super) const PURGED_AT_MOST: u32 = 500;

/// The lease table's name, checked, and the SQL under it.
#[derive(Clone, Debug)]
pub(super) struct Table {
    pub(super) name: String,
}

/// The statements the store sends, made once per table name.
#[derive(Debug)]
pub(super) struct Statements {
    /// Takes a key that has no row (never used, or purged): a plain
    /// `INSERT`, which costs the server less than the upsert below; a
    /// duplicate-key error when the row exists. `LAST_INSERT_ID` is the
    /// fencing value. Parameters: id, key, token, ttl µs.
    pub(super) insert: String,
    /// Takes a key whose row is free (a released key's row is kept): an
    /// `UPDATE` by primary key, cheaper than the upsert; `LAST_INSERT_ID`
    /// is the fencing value, none when the row was held or is gone.
    /// Parameters: token, ttl µs, id.
    pub(super) take: String,
    /// Takes a free or expired key for an exclusive claim, or renews the
    /// same token's lease; a refusal sets [`HELD`] with how it is held.
    /// Parameters: id, key, token, ttl µs, waits (0/1), token, token,
    /// token, ttl µs.
    pub(super) acquire: String,
    /// Extends an exclusive lease (a renewal, a lingering release):
    /// `LAST_INSERT_ID` is its fencing value when it was still ours.
    /// Parameters: µs, id, token.
    pub(super) extend: String,
    /// Ends an exclusive lease, keeping the row (and its fencing value)
    /// free: `LAST_INSERT_ID` set when it was ours. Parameters: id, token.
    pub(super) release: String,
    /// Moves an exclusive lease to a new token with a new fencing value
    /// (`LAST_INSERT_ID`, 0 when it was no longer ours). Parameters: new
    /// token, ttl µs, id, token.
    pub(super) hand_over: String,
    /// One attempt at a share or a permit: answer, value, held.
    pub(super) claim: String,
    /// Extends or releases a share or permit: 1 when it was still held.
    pub(super) unclaim: String,
    /// Ends the key's lease and every share or permit of it.
    pub(super) force: String,
    /// Up to [`PURGED_AT_MOST`] rows of keys free for longer than
    /// [`KEPT_FREE_SECS`], read without locking anything.
    pub(super) purge_find: String,
    /// Deletes one of them, if it is still free that long. Parameter: id.
    pub(super) purge_key: String,
    /// Deletes the holder rows of a key so purged. Parameter: id.
    pub(super) purge_holders: String,
    /// The key's row and its newest live holder.
    pub(super) inspect: String,
}

impl Table {
    pub(super) fn new(name: &str) -> Result<Table, StoreError> {
        // `_holders` and the procedures' suffixes must fit MySQL's 64.
        let valid = !name.is_empty()
            && name.len() <= 48
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(StoreError::misuse(format!(
                "invalid table name `{name}`: letters, digits and `_`, at most 48 bytes, not starting with a digit"
            )));
        }
        Ok(Table {
            name: name.to_ascii_lowercase(),
        })
    }

    /// The names of the procedures, as `information_schema.ROUTINES` lists
    /// them.
    pub(super) fn procedures(&self) -> [String; 3] {
        let t = &self.name;
        [
            format!("{t}_claim_v2"),
            format!("{t}_unclaim_v2"),
            format!("{t}_force_v2"),
        ]
    }

    /// The two tables, each `CREATE TABLE IF NOT EXISTS`.
    pub(super) fn tables(&self) -> [String; 2] {
        let t = &self.name;
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
    id           BINARY(32)      NOT NULL PRIMARY KEY,  -- SHA-256 of the key
    lock_key     VARBINARY(255)  NOT NULL,              -- the key's first 255 bytes, for people
    token        VARBINARY(40)   NOT NULL,              -- the holder's token, or '*shared', '*permits:N'
    fencing      BIGINT UNSIGNED NOT NULL,              -- the last grant's fencing value
    expires_at   DATETIME(6)     NOT NULL,              -- by the server's clock, UTC
    writer_until DATETIME(6)     NULL                   -- a writer waits: no new shares until then
) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_holders (  -- one row per share or permit
    id         BINARY(32)      NOT NULL,
    token      VARBINARY(40)   NOT NULL,
    fencing    BIGINT UNSIGNED NOT NULL,
    expires_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (id, token)
) ENGINE=InnoDB"
            ),
        ]
    }

    /// The procedures of shares and permits, each a `CREATE PROCEDURE`
    /// (made only when missing: see [`procedures`](Self::procedures)).
    ///
    /// Each runs one transaction at `READ COMMITTED` (no gap locks, so two
    /// keys' claims never deadlock each other), locks the key's row before
    /// any holder row, and answers with one row.
    pub(super) fn procedure_bodies(&self) -> [String; 3] {
        let t = &self.name;
        let [claim, unclaim, force] = self.procedures();
        let begin = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;";
        [
            // answer 1: granted, val the fencing value (a repeat by the same
            // token renews and answers as the first did); 0: refused, val
            // the µs until it could be granted; 2: the key serves another
            // claim, held says which (the claim rule, `Claim::meets`).
            format!(
                "CREATE PROCEDURE {claim}(
    p_id BINARY(32), p_key VARBINARY(255), p_token VARBINARY(40), p_ttl BIGINT,
    p_claim VARBINARY(40), p_limit INT, p_waits BOOLEAN)
MODIFIES SQL DATA
BEGIN
    DECLARE k_token VARBINARY(40);
    DECLARE k_fencing BIGINT UNSIGNED;
    DECLARE k_expires DATETIME(6);
    DECLARE k_writer DATETIME(6);
    DECLARE now_ DATETIME(6);
    DECLARE live INT DEFAULT 0;
    DECLARE first_end DATETIME(6);
    DECLARE mine BIGINT UNSIGNED DEFAULT NULL;
    DECLARE answer INT DEFAULT 1;
    DECLARE val BIGINT UNSIGNED DEFAULT 0;
    DECLARE held VARBINARY(40) DEFAULT NULL;
    {begin}
    INSERT INTO {t} (id, lock_key, token, fencing, expires_at)
        VALUES (p_id, p_key, p_claim, 0, '1970-01-01 00:00:01')
        ON DUPLICATE KEY UPDATE id = id;
    SELECT token, fencing, expires_at, writer_until
        INTO k_token, k_fencing, k_expires, k_writer
        FROM {t} WHERE id = p_id FOR UPDATE;
    SET now_ = UTC_TIMESTAMP(6);
    body: BEGIN
        IF k_expires > now_ AND LEFT(k_token, 1) <> '*' THEN
            -- A mutex or a writer holds it: a share waits, a permit is a mismatch.
            IF p_claim <> '*shared' THEN
                SET answer = 2, held = k_token;
            ELSE
                SET answer = 0, val = TIMESTAMPDIFF(MICROSECOND, now_, k_expires);
            END IF;
            LEAVE body;
        END IF;
        IF k_expires <= now_ THEN
            -- A free key: holder rows left from its last shares are stale.
            DELETE FROM {t}_holders WHERE id = p_id;
        ELSE
            DELETE FROM {t}_holders WHERE id = p_id AND expires_at <= now_;
            SELECT fencing INTO mine FROM {t}_holders WHERE id = p_id AND token = p_token;
            IF mine IS NOT NULL THEN
                UPDATE {t}_holders SET expires_at = now_ + INTERVAL p_ttl MICROSECOND
                    WHERE id = p_id AND token = p_token;
                UPDATE {t} SET expires_at = GREATEST(expires_at, now_ + INTERVAL p_ttl MICROSECOND)
                    WHERE id = p_id;
                SET answer = 1, val = mine;
                LEAVE body;
            END IF;
            SELECT COUNT(*), MIN(expires_at) INTO live, first_end
                FROM {t}_holders WHERE id = p_id;
            IF live > 0 AND k_token <> p_claim THEN
                SET answer = 2, held = k_token;
                LEAVE body;
            END IF;
        END IF;
        IF p_claim = '*shared' AND k_writer > now_ THEN
            -- A writer waits. On a free key it is on its way or was served
            -- already: it keeps the key 50 ms more at most.
            IF live = 0 AND k_writer > now_ + INTERVAL 50000 MICROSECOND THEN
                SET k_writer = now_ + INTERVAL 50000 MICROSECOND;
                UPDATE {t} SET writer_until = k_writer WHERE id = p_id;
            END IF;
            SET answer = 0, val = TIMESTAMPDIFF(MICROSECOND, now_, k_writer);
            LEAVE body;
        END IF;
        IF p_claim <> '*shared' AND live >= p_limit THEN
            SET answer = 0, val = GREATEST(0, TIMESTAMPDIFF(MICROSECOND, now_, first_end));
            LEAVE body;
        END IF;
        SET val = GREATEST(k_fencing + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', now_));
        INSERT INTO {t}_holders (id, token, fencing, expires_at)
            VALUES (p_id, p_token, val, now_ + INTERVAL p_ttl MICROSECOND);
        UPDATE {t} SET token = p_claim, fencing = val,
            expires_at = IF(live > 0, GREATEST(expires_at, now_ + INTERVAL p_ttl MICROSECOND),
                            now_ + INTERVAL p_ttl MICROSECOND)
            WHERE id = p_id;
    END body;
    COMMIT;
    SELECT answer, val, held;
END"
            ),
            // A holder's share or permit ends p_us from now (a renewal, a
            // lingering release), or at once with p_release: 1 when it was
            // still held, else 0.
            format!(
                "CREATE PROCEDURE {unclaim}(
    p_id BINARY(32), p_token VARBINARY(40), p_us BIGINT, p_release BOOLEAN)
MODIFIES SQL DATA
BEGIN
    DECLARE k_token VARBINARY(40) DEFAULT NULL;
    DECLARE k_expires DATETIME(6);
    DECLARE now_ DATETIME(6);
    DECLARE ends DATETIME(6) DEFAULT NULL;
    DECLARE mine INT DEFAULT 0;
    DECLARE done INT DEFAULT 0;
    {begin}
    SELECT token, expires_at INTO k_token, k_expires
        FROM {t} WHERE id = p_id FOR UPDATE;
    SET now_ = UTC_TIMESTAMP(6);
    body: BEGIN
        IF k_token IS NULL OR k_expires <= now_ OR LEFT(k_token, 1) <> '*' THEN
            LEAVE body;
        END IF;
        SELECT COUNT(*) INTO mine FROM {t}_holders
            WHERE id = p_id AND token = p_token AND expires_at > now_;
        IF mine = 0 THEN
            LEAVE body;
        END IF;
        SET done = 1;
        IF NOT p_release THEN
            UPDATE {t}_holders SET expires_at = now_ + INTERVAL p_us MICROSECOND
                WHERE id = p_id AND token = p_token;
            UPDATE {t} SET expires_at = GREATEST(expires_at, now_ + INTERVAL p_us MICROSECOND)
                WHERE id = p_id;
            LEAVE body;
        END IF;
        DELETE FROM {t}_holders WHERE id = p_id AND (token = p_token OR expires_at <= now_);
        SELECT MAX(expires_at) INTO ends FROM {t}_holders WHERE id = p_id;
        -- The last one out frees the row, which keeps its fencing value
        -- (and a waiting writer's mark, for its turn).
        UPDATE {t} SET expires_at = COALESCE(ends, now_) WHERE id = p_id;
    END body;
    COMMIT;
    SELECT done;
END"
            ),
            // Ends the key's lease and every share or permit of it, keeping
            // the row free with its fencing value: 1 when something was
            // held.
            format!(
                "CREATE PROCEDURE {force}(p_id BINARY(32))
MODIFIES SQL DATA
BEGIN
    DECLARE k_expires DATETIME(6) DEFAULT NULL;
    {begin}
    SELECT expires_at INTO k_expires FROM {t} WHERE id = p_id FOR UPDATE;
    UPDATE {t} SET token = '', writer_until = NULL,
        expires_at = LEAST(expires_at, UTC_TIMESTAMP(6)) WHERE id = p_id;
    DELETE FROM {t}_holders WHERE id = p_id;
    COMMIT;
    SELECT COALESCE(k_expires > UTC_TIMESTAMP(6), 0);
END"
            ),
        ]
    }

    /// Every statement that makes the schema, in order, for an
    /// administrator: the tables, then the procedures (which an
    /// administrator drops first when upgrading them).
    pub(super) fn schema(&self) -> String {
        let mut sql = String::new();
        for table in self.tables() {
            sql.push_str(&table);
            sql.push_str(";\n\n");
        }
        sql.push_str("DELIMITER //\n");
        for procedure in self.procedure_bodies() {
            sql.push_str(&procedure);
            sql.push_str(" //\n\n");
        }
        sql.push_str("DELIMITER ;\n");
        sql
    }

    pub(super) fn statements(&self) -> Statements {
        let t = &self.name;
        let [claim, unclaim, force] = self.procedures();
        let now = "UTC_TIMESTAMP(6)";
        // How a refusal says the key is held: 0 by an exclusive holder, 1
        // by shares, N by permits of N.
        let kind = format!(
            "IF(LEFT(token, 1) <> '*', 0, IF(token = '*shared', 1, \
             LEAST({MAX_KIND}, CAST(SUBSTRING(token, 10) AS UNSIGNED))))"
        );
        let first_value = format!("LAST_INSERT_ID(GREATEST(1, {NOW_US}))");
        let free_long = format!(
            "expires_at < {now} - INTERVAL {KEPT_FREE_SECS} SECOND
    AND (writer_until IS NULL OR writer_until < {now})"
        );
        Statements {
            insert: format!(
                "INSERT INTO {t} (id, lock_key, token, fencing, expires_at)
VALUES (?, ?, ?, {first_value}, {now} + INTERVAL ? MICROSECOND)"
            ),
            // Assignments run left to right, each later one seeing the
            // earlier ones' values: `expires_at` and `token` are read
            // before they are written, `expires_at` last.
            acquire: format!(
                "INSERT INTO {t} (id, lock_key, token, fencing, expires_at)
VALUES (?, ?, ?, {first_value}, {now} + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
    writer_until = IF(? AND expires_at > {now} AND token = '*shared',
                      {now} + INTERVAL 6 SECOND, writer_until),
    fencing = IF(expires_at <= {now}, LAST_INSERT_ID(GREATEST(fencing + 1, {NOW_US})),
              IF(token = ?, LAST_INSERT_ID(fencing),
                 fencing + 0 * LAST_INSERT_ID({HELD} + {kind} * 4294967296
                     + LEAST(4294967295, GREATEST(0, TIMESTAMPDIFF(MICROSECOND, {now}, expires_at)))))),
    token = IF(expires_at <= {now}, ?, token),
    expires_at = IF(token = ?, {now} + INTERVAL ? MICROSECOND, expires_at)"
            ),
            take: format!(
                "UPDATE {t} SET token = ?, fencing = LAST_INSERT_ID(GREATEST(fencing + 1, {NOW_US})),
    expires_at = {now} + INTERVAL ? MICROSECOND
WHERE id = ? AND expires_at <= {now}"
            ),
            extend: format!(
                "UPDATE {t} SET fencing = LAST_INSERT_ID(fencing), expires_at = {now} + INTERVAL ? MICROSECOND
WHERE id = ? AND token = ? AND expires_at > {now}"
            ),
            // Free a second ago: also to a statement that read the clock
            // a moment before this one. A waiting writer's mark is served.
            // The token stays (a row updated in place costs the server
            // less): the holder's own statements all ask for a live lease.
            release: format!(
                "UPDATE {t} SET fencing = LAST_INSERT_ID(fencing),
    expires_at = {now} - INTERVAL 1 SECOND, writer_until = NULL
WHERE id = ? AND token = ? AND expires_at > {now}"
            ),
            hand_over: format!(
                "UPDATE {t} SET token = ?, fencing = LAST_INSERT_ID(GREATEST(fencing + 1, {NOW_US})),
    expires_at = {now} + INTERVAL ? MICROSECOND
WHERE id = ? AND token = ? AND expires_at > {now}"
            ),
            claim: format!("CALL {claim}(?, ?, ?, ?, ?, ?, ?)"),
            unclaim: format!("CALL {unclaim}(?, ?, ?, ?)"),
            force: format!("CALL {force}(?)"),
            purge_find: format!(
                "SELECT id FROM {t} WHERE {free_long}
LIMIT {PURGED_AT_MOST}"
            ),
            purge_key: format!("DELETE FROM {t} WHERE id = ? AND {free_long}"),
            purge_holders: format!(
                "DELETE FROM {t}_holders WHERE id = ?
    AND expires_at < {now} - INTERVAL {KEPT_FREE_SECS} SECOND"
            ),
            inspect: format!(
                "SELECT l.token, l.fencing, TIMESTAMPDIFF(MICROSECOND, {now}, l.expires_at),
    h.token, h.fencing, TIMESTAMPDIFF(MICROSECOND, {now}, h.expires_at),
    (SELECT COUNT(*) FROM {t}_holders c WHERE c.id = l.id AND c.expires_at > {now})
FROM {t} l
LEFT JOIN {t}_holders h
    ON h.id = l.id AND LEFT(l.token, 1) = '*' AND h.expires_at > {now}
WHERE l.id = ?
ORDER BY h.fencing DESC
LIMIT 1"
            ),
        }
    }
}

/// A duration in whole microseconds, as the statements take it.
pub(super) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// How a refused exclusive acquire found the key held, from its
/// `LAST_INSERT_ID` (at least [`HELD`]): the kind (0 an exclusive holder,
/// 1 shares, N permits of N) and the holder's remaining time.
pub(super) fn held(value: u64) -> (u32, Duration) {
    let kind = ((value & !HELD) >> 32) as u32 & MAX_KIND;
    (kind, Duration::from_micros(value & 0xFFFF_FFFF))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        assert!(Table::new("lock_leases").is_ok());
        assert_eq!(Table::new("Locks_2").unwrap().name, "locks_2");
        for bad in ["", "2locks", "locks; DROP TABLE x", "a-b", &"x".repeat(49)] {
            assert!(Table::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_refusal_reads_back_how_the_key_is_held() {
        assert_eq!(held(HELD + 1500), (0, Duration::from_micros(1500)));
        assert_eq!(held(HELD + (1 << 32) + 7), (1, Duration::from_micros(7)));
        assert_eq!(
            held(HELD + (5 << 32) + 0xFFFF_FFFF),
            (5, Duration::from_micros(0xFFFF_FFFF))
        );
    }
}
