package arbiter

import "time"

// The audit trail (docs/guides/security.md, "Audit trail"): every admin
// action and every refused request, with who (the principal), from where
// (the client's address) and when, kept in the store as records of kind
// RecordAudit — the newest AuditKeep of them — and listed by
// GET /api/v1/audit. Refused requests can come in floods: the HTTP server
// records a bounded number per minute and folds the rest into one entry
// per address with a Count, so an attacker can neither fill the store nor
// slow it down.

// RecordAudit is the record kind of audit entries (key: the Seq, zero-padded
// to 20 digits so keys sort in order).
const RecordAudit = "audit"

// Kinds of audit entries.
const (
	AuditAction  = "action"  // an admin did something
	AuditRefused = "refused" // a request was refused (401 or 403)
)

// DefaultAuditKeep is how many audit entries are kept by default.
const DefaultAuditKeep = 10000

// AuditEntry is one line of the audit trail.
type AuditEntry struct {
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // AuditAction or AuditRefused
	// Principal is the token's name ("" when unknown: no token, a wrong one);
	// Role its role; Via how the caller was taken for it (bearer, cookie,
	// operator token, client certificate, open server, signal).
	Principal string `json:"principal"`
	Role      string `json:"role,omitempty"`
	Via       string `json:"via,omitempty"`
	Address   string `json:"address"` // the client's IP address, or "local"
	Action    string `json:"action"`  // the route: "POST /api/v1/machines/{name}/drain", "SIGHUP reload"
	Target    string `json:"target,omitempty"`
	Status    int    `json:"status,omitempty"` // the HTTP status answered
	Detail    string `json:"detail,omitempty"`
	// Count is how many refusals this entry stands for, when more than one
	// were folded into it; Until is the last one's time then.
	Count int        `json:"count,omitempty"`
	Until *time.Time `json:"until,omitempty"`
}

// RecordAuditEntries appends entries to the trail (Seq and Time are the
// engine's; the engine keeps the newest of them, as configured). Texts are
// clipped and escaped to the text rule rather than refused: an audit line
// must be written whatever the refused request held. Result: None.
type RecordAuditEntries struct {
	Entries []AuditEntry
}

func (RecordAuditEntries) isCommand()   {}
func (RecordAuditEntries) result() None { return None{} }

// AuditFilter selects audit entries: Kind ("" for both), entries with Seq
// below Before (0 for the newest), at most Limit (newest first).
type AuditFilter struct {
	Kind   string
	Before int64
	Limit  int
}
