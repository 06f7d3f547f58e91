-- The lease table's shares and permits ({t} stands for the table's name).
-- A key held by shares or permits has its row in {t}, as a mutex's, with
-- the claim in place of a token ('*shared', '*permits:N'), the fencing
-- value of its last grant, and the expiry of its longest-lived holder; each
-- holder has a row in {t}_holders. Every function locks the key's row
-- before a holder row, so they never deadlock one another; each of their
-- statements reads what committed before it (a volatile function's own
-- snapshot per statement), so counts taken under the row lock are exact.

-- One attempt by p_token to claim p_claim ('*shared', or '*permits:N' with
-- p_limit N) on the key, as the acquire statement in the key's turn p_turn.
-- answer 1: granted, value the fencing value (a repeat by the same token
-- renews and answers as the first run did); 0: refused, value how many ms
-- until it could be granted, the row marked for a notification when p_mark;
-- 2: the key serves another claim, held says which (the claim rule,
-- `Claim::meets` in the crate: a mismatch, answered at once and leaving
-- nothing behind).
CREATE OR REPLACE FUNCTION {t}_claim(
    p_id bytea, p_key bytea, p_token text, p_ttl bigint, p_claim text,
    p_limit integer, p_turn integer, p_mark boolean,
    OUT answer integer, OUT value bigint, OUT held text)
LANGUAGE plpgsql AS $fn$
DECLARE
    k {t}%ROWTYPE;
    now_ timestamptz;
    ttl interval := p_ttl * interval '1 millisecond';
    live integer := 0;
    first_end timestamptz;
    mine bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('{t}'), p_turn);
    LOOP
        SELECT * INTO k FROM {t} WHERE id = p_id FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO {t} (id, key, token, fencing, expires_at)
        VALUES (p_id, p_key, p_claim, 0, '-infinity')
        ON CONFLICT (id) DO NOTHING;
    END LOOP;
    now_ := clock_timestamp();
    IF k.expires_at > now_ AND left(k.token, 1) <> '*' THEN
        -- A mutex or a writer holds it: a share waits, a permit is a
        -- mismatch.
        IF p_claim <> '*shared' THEN
            answer := 2;
            held := k.token;
            RETURN;
        END IF;
        answer := 0;
        value := ceil(extract(epoch FROM (k.expires_at - now_)) * 1000);
        IF p_mark AND NOT k.waiting THEN
            UPDATE {t} SET waiting = true WHERE id = p_id;
        END IF;
        RETURN;
    END IF;
    IF k.expires_at <= now_ THEN
        -- A free key: holder rows left from its last shares are stale.
        DELETE FROM {t}_holders WHERE id = p_id;
    ELSE
        DELETE FROM {t}_holders WHERE id = p_id AND expires_at <= now_;
        UPDATE {t}_holders SET expires_at = now_ + ttl
        WHERE id = p_id AND token = p_token
        RETURNING fencing INTO mine;
        IF FOUND THEN
            UPDATE {t} SET expires_at = greatest(expires_at, now_ + ttl) WHERE id = p_id;
            answer := 1;
            value := mine;
            RETURN;
        END IF;
        SELECT count(*), min(expires_at) INTO live, first_end
        FROM {t}_holders WHERE id = p_id;
        IF live > 0 AND k.token <> p_claim THEN
            answer := 2;
            held := k.token;
            RETURN;
        END IF;
    END IF;
    IF p_claim = '*shared' AND k.writer_until > now_ THEN
        -- A writer waits. On a free key it is on its way (woken by the
        -- last release) or was served already: it keeps the key 50 ms more
        -- at most, so a stale mark costs readers no more.
        IF live = 0 AND k.writer_until > now_ + interval '50 ms' THEN
            k.writer_until := now_ + interval '50 ms';
            UPDATE {t} SET writer_until = k.writer_until WHERE id = p_id;
        END IF;
        answer := 0;
        value := ceil(extract(epoch FROM (k.writer_until - now_)) * 1000);
    ELSIF p_claim <> '*shared' AND live >= p_limit THEN
        answer := 0;
        value := ceil(extract(epoch FROM (first_end - now_)) * 1000);
    END IF;
    IF answer = 0 THEN
        IF p_mark AND live > 0 AND NOT k.waiting THEN
            UPDATE {t} SET waiting = true WHERE id = p_id;
        END IF;
        RETURN;
    END IF;
    value := nextval('{t}_fencing');
    INSERT INTO {t}_holders (id, token, fencing, expires_at)
    VALUES (p_id, p_token, value, now_ + ttl);
    UPDATE {t} SET token = p_claim, fencing = value,
        expires_at = CASE WHEN live > 0 THEN greatest(expires_at, now_ + ttl) ELSE now_ + ttl END,
        waiting = waiting AND live > 0
    WHERE id = p_id;
    answer := 1;
END
$fn$;

-- A holder's share or permit ends p_ms from now (a renewal, a lingering
-- release), or at once with p_release, waking waiters on p_channel. False
-- when it was no longer held.
CREATE OR REPLACE FUNCTION {t}_unclaim(
    p_id bytea, p_token text, p_ms bigint, p_release boolean, p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    k {t}%ROWTYPE;
    now_ timestamptz;
    ends timestamptz;
BEGIN
    SELECT * INTO k FROM {t} WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    now_ := clock_timestamp();
    IF k.expires_at <= now_ OR left(k.token, 1) <> '*' THEN
        RETURN false;
    END IF;
    IF NOT p_release THEN
        UPDATE {t}_holders SET expires_at = now_ + p_ms * interval '1 millisecond'
        WHERE id = p_id AND token = p_token AND expires_at > now_
        RETURNING expires_at INTO ends;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        UPDATE {t} SET expires_at = greatest(expires_at, ends) WHERE id = p_id;
        RETURN true;
    END IF;
    DELETE FROM {t}_holders WHERE id = p_id AND token = p_token AND expires_at > now_;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM {t}_holders WHERE id = p_id AND expires_at <= now_;
    SELECT max(expires_at) INTO ends FROM {t}_holders WHERE id = p_id;
    IF ends IS NOT NULL THEN
        UPDATE {t} SET expires_at = ends WHERE id = p_id;
    ELSIF k.writer_until > now_ THEN
        -- Free, with the waiting writer's mark kept for its turn.
        UPDATE {t} SET expires_at = now_, waiting = false WHERE id = p_id;
    ELSE
        DELETE FROM {t} WHERE id = p_id;
    END IF;
    IF k.waiting THEN
        PERFORM pg_notify(p_channel, encode(p_id, 'hex'));
    END IF;
    RETURN true;
END
$fn$;

-- Deletes the key's lease and every share or permit of it, whoever holds
-- them, and wakes waiters on p_channel. False when nothing was held.
CREATE OR REPLACE FUNCTION {t}_force(p_id bytea, p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    k {t}%ROWTYPE;
BEGIN
    SELECT * INTO k FROM {t} WHERE id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM {t} WHERE id = p_id;
    DELETE FROM {t}_holders WHERE id = p_id;
    IF k.expires_at <= clock_timestamp() THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(p_channel, encode(p_id, 'hex'));
    RETURN true;
END
$fn$;
