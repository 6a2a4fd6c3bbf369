-- txlimit_deny raises SQLSTATE TXL01, txlimit's own. The one-statement
-- takes (TakeBucket, TakeWindow, TakeReserve) sent in one pipeline with the
-- caller's COMMIT (Limiter.CommitTx, BeginFunc) call it where they would
-- grant nothing, so that the server skips the COMMIT and nothing of the
-- transaction remains. It is PL/pgSQL because a LANGUAGE sql function
-- cannot raise; it never returns.

-- +goose Up
CREATE FUNCTION txlimit_deny() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$ BEGIN RAISE EXCEPTION 'txlimit: a take at commit was not granted' USING ERRCODE = 'TXL01'; END $$;

-- +goose Down
DROP FUNCTION txlimit_deny();
