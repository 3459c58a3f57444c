package httpapi

import (
	"net/http"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// High availability (docs/guides/high-availability.md): what the API says
// of the replicas, and what a follower, which has no control plane, needs
// to answer in the API's own forms.

// Health is the answer of GET /api/v1/health. Under HA it carries the
// replica's view of the cluster (its role, the term, the leader, the
// replicas); a follower answers it itself, without LastSeq.
type Health struct {
	Status  string    `json:"status"`
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	LastSeq *int64    `json:"last_seq,omitempty"` // nil on a follower
	// Problem says what is wrong when Status is "degraded".
	Problem string `json:"problem,omitempty"`
	*arbiter.Cluster
}

// WriteHealth answers a health request: 200 "ok", or 503 "degraded" with
// the Problem.
func WriteHealth(w http.ResponseWriter, h Health) {
	status := http.StatusOK
	h.Status = "ok"
	if h.Problem != "" {
		h.Status, status = "degraded", http.StatusServiceUnavailable
	}
	h.Time = time.Now().UTC().Truncate(time.Millisecond)
	httpio.WriteJSON(w, status, h)
}

// WriteError answers err in the error form of the surface r speaks (the
// fleet's under /v1, the swap arbiter's under /api/swap and /api/schedule,
// the native one elsewhere), with the status of its code.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	st, code := statusOf(w, err)
	writeError(w, r, st, code, arbiter.ErrorMessage(err))
}
