package pgstore

// The SQLSTATEs the store names, as PostgreSQL's errcodes table (Appendix A)
// names them. They are spelled out here rather than imported from
// github.com/jackc/pgerrcode to keep a user's module graph one module
// smaller.
const (
	undefinedTable             = "42P01"
	undefinedColumn            = "42703"
	duplicatePreparedStatement = "42P05"
	invalidSQLStatementName    = "26000"
	serializationFailure       = "40001"
	deadlockDetected           = "40P01"
	lockNotAvailable           = "55P03"
	queryCanceled              = "57014"
	adminShutdown              = "57P01"
	crashShutdown              = "57P02"
	cannotConnectNow           = "57P03"
	tooManyConnections         = "53300"
	invalidCatalogName         = "3D000"
)
