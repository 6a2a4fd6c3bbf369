package txlimit

// EventOutcome and EventErrorKind are what the Limiter fills an Event's
// Outcome and ErrorKind with.
func EventOutcome(e Event) string   { return e.outcome() }
func EventErrorKind(e Event) string { return e.errorKind() }
