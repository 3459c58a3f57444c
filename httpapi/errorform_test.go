package httpapi

import (
	"testing"
)

// TestErrorFormPerSurface: refusals made before any handler runs — a bad
// token, a wrong method, no route — answer in the form of the surface the
// caller speaks: the fleet's {"error": "…"} under /v1, the swap arbiter's
// {"detail": "…"} (the native error beside it) under /api/swap and
// /api/schedule, and the native {"error": {"code", "message"}} elsewhere.
func TestErrorFormPerSurface(t *testing.T) {
	e := newCoordEnv(t)
	for _, c := range []struct {
		method, path, token string
		status              int
		form                string
	}{
		{"POST", "/api/swap/lock", "wrong", 401, "compat"},
		{"GET", "/api/schedule", "wrong", 401, "compat"},
		{"DELETE", "/api/schedule/nightly", "wrong", 401, "compat"},
		{"PUT", "/api/swap/lock", testUser, 405, "compat"},
		{"GET", "/v1/nothing", "", 404, "fleet"},
		{"DELETE", "/v1/jobs", "", 405, "fleet"},
		{"GET", "/api/v1/machines", "wrong", 401, "native"},
		{"GET", "/api/v1/nothing", testUser, 404, "native"},
	} {
		a := e.call(c.method, c.path, c.token, nil)
		var body map[string]any
		a.decode(t, &body)
		var form string
		switch errv := body["error"].(type) {
		case string:
			form = "fleet"
		case map[string]any:
			form = "native"
			if d, ok := body["detail"].(string); ok && d == errv["message"] {
				form = "compat"
			}
		}
		if a.status != c.status || form != c.form {
			t.Errorf("%s %s: %d %s, want %d in the %s form", c.method, c.path, a.status, a.body, c.status, c.form)
		}
		if c.form == "fleet" && len(body) != 1 {
			t.Errorf("%s %s: %s, want only the error", c.method, c.path, a.body)
		}
	}
}
