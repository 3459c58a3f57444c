package httpapi

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

const testBob = "bob-secret-0123456789"

// trustTokens are the test tokens and bob, a second user configured by his
// secret's SHA-256 only.
func trustTokens() []Token {
	return append(append([]Token(nil), testTokens...), Token{Name: "bob", Role: arbiter.RoleUser, SHA256: sha256.Sum256([]byte(testBob))})
}

// TestDashboardOffersOnlyYourOwn is finding 3 on the dashboard: bob's
// request "as alice" shows bob as its owner, alice as a label, and alice's
// page offers no Cancel on it; bob's does.
func TestDashboardOffersOnlyYourOwn(t *testing.T) {
	f := newFakePlane()
	s := NewServer(Options{Plane: f, Tokens: trustTokens()})
	a := call(t, s, "POST", "/api/v1/allocations", testBob, `{"gpus": 1, "owner": "alice"}`)
	if a.status != 201 {
		t.Fatalf("allocate: %d %s", a.status, a.body)
	}
	alice := uiPanelsAnswer(t, s, testUser, "?p=queue")["queue"]
	if !strings.Contains(alice, `<span class="who`) || !strings.Contains(alice, ">bob</span>") || !strings.Contains(alice, `<span class="label" title="alice">alice</span>`) {
		t.Fatalf("the queue does not show bob as the owner and alice as the label:\n%s", alice)
	}
	if strings.Contains(alice, `data-action="release"`) {
		t.Errorf("alice's page offers Cancel on bob's request:\n%s", alice)
	}
	if bob := uiPanelsAnswer(t, s, testBob, "?p=queue")["queue"]; !strings.Contains(bob, `data-action="release"`) {
		t.Errorf("bob's page offers no Cancel on his own request:\n%s", bob)
	}
}

// TestSetTokens: a reload's tokens take effect at once — a removed token
// and a changed one are refused, a new one is taken — and a server cannot
// be turned open or closed by it.
func TestSetTokens(t *testing.T) {
	s := NewServer(Options{Plane: newFakePlane(), Tokens: trustTokens()})
	if a := call(t, s, "GET", "/api/v1/whoami", testBob, nil); a.status != 200 || !strings.Contains(string(a.body), `"name":"bob"`) {
		t.Fatalf("bob by digest: %d %s", a.status, a.body)
	}
	fp := TokenFingerprints(trustTokens())
	if len(fp) != 4 || len(fp["bob"]) != 64 {
		t.Fatalf("fingerprints %v", fp)
	}
	next := []Token{testTokens[0], {Name: "alice", Role: arbiter.RoleUser, Secret: "alice-new-secret-0123"}}
	if err := s.SetTokens(next); err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]int{testBob: 401, testUser: 401, "alice-new-secret-0123": 200, testAdmin: 200} {
		if a := call(t, s, "GET", "/api/v1/whoami", tok, nil); a.status != want {
			t.Errorf("token %s after the reload: %d, want %d", tok, a.status, want)
		}
	}
	if TokenFingerprints(next)["alice"] == fp["alice"] {
		t.Error("alice's changed token has the same fingerprint: her sessions would live on")
	}
	if err := s.SetTokens(nil); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Errorf("removing every token: %v, want refused", err)
	}
	open := NewServer(Options{Plane: newFakePlane()})
	if err := open.SetTokens(testTokens); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Errorf("adding the first token: %v, want refused", err)
	}
}

// TestAuditRecordsAdminActionsAndRefusals: through the HTTP layer, an
// admin's drain is an action, a wrong token and a user on an admin route are
// refusals; a user's own allocation and every read are neither.
func TestAuditRecordsAdminActionsAndRefusals(t *testing.T) {
	f := newFakePlane()
	s := NewServer(Options{Plane: f, Tokens: trustTokens()})
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU})
	call(t, s, "POST", "/api/v1/machines/gpu1/drain", testAdmin, nil)
	call(t, s, "POST", "/api/v1/machines/gpu1/drain", testUser, nil)
	call(t, s, "GET", "/api/v1/machines", "nope-not-a-token", nil)
	call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus": 1}`)
	call(t, s, "GET", "/api/v1/machines", testAdmin, nil)
	call(t, s, "GET", "/api/v1/machines", "", nil)
	es := f.auditEntries()
	if len(es) != 4 {
		t.Fatalf("audit %+v, want 4 entries", es)
	}
	if es[2].Via != viaBearer || es[3].Via != viaNone {
		t.Errorf("refusals came via %q and %q, want %q (a wrong token) and %q (nothing sent)", es[2].Via, es[3].Via, viaBearer, viaNone)
	}
	for i, want := range []struct{ kind, principal, action string }{
		{arbiter.AuditAction, "ops", "POST /api/v1/machines/{name}/drain"},
		{arbiter.AuditRefused, "alice", "POST /api/v1/machines/{name}/drain"},
		{arbiter.AuditRefused, "", "GET /api/v1/machines"},
	} {
		if e := es[i]; e.Kind != want.kind || e.Principal != want.principal || e.Action != want.action || e.Address == "" {
			t.Errorf("entry %d: %+v, want %+v", i, e, want)
		}
	}
	if a := call(t, s, "GET", "/api/v1/audit?kind=refused&limit=1", testAdmin, nil); a.status != 200 || !strings.Contains(string(a.body), `"next"`) {
		t.Errorf("audit page: %d %s", a.status, a.body)
	}
	if a := call(t, s, "GET", "/api/v1/audit", testUser, nil); a.status != 403 {
		t.Errorf("a user reading the audit: %d, want 403", a.status)
	}
}
