package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/connlimit"
	"github.com/arbiter-hq/arbiter/poll"
)

// Issue 12 ("Trust and safety"), end to end: the findings that need the
// real server wired together.

// openServerAt opens (without serving) a server on the given data
// directory and configuration, returning Open's error.
func openServerAt(t *testing.T, configText, dataDir string, getenv func(string) string, extra ...string) (*serverMain, error) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "arbiter.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o600); err != nil {
		t.Fatal(err)
	}
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	env := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: getenv}
	args := append([]string{"--config", cfg, "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--no-local"}, extra...)
	m, err := newServerMain(env, args)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(context.Background()); err != nil {
		return nil, err
	}
	t.Cleanup(m.Close)
	return m, nil
}

// TestSecondServerOnOneDataDirRefused is finding 1 on SQLite: a second
// server on the data directory of a running one refuses to start, naming
// it, instead of handing out the same GPUs under the same ids.
func TestSecondServerOnOneDataDirRefused(t *testing.T) {
	dir := t.TempDir()
	a, err := openServerAt(t, twoHosts, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openServerAt(t, twoHosts, dir, nil)
	if err == nil {
		t.Fatal("a second server started on the same data directory")
	}
	for _, want := range []string{"data directory " + dir, fmt.Sprintf("arbiter server pid %d", os.Getpid()), "--data-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Once the first has stopped, the next may start.
	a.Close()
	if _, err := openServerAt(t, twoHosts, dir, nil); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}

// TestSecondServerOnOnePostgresRefused is finding 1 on PostgreSQL.
func TestSecondServerOnOnePostgresRefused(t *testing.T) {
	url := os.Getenv("ARBITER_TEST_POSTGRES")
	if url == "" {
		t.Skip("ARBITER_TEST_POSTGRES is not set")
	}
	db := pgSchemaURL(t, url)
	conf := twoHosts + "\n[server]\ndatabase = \"" + db + "\"\n"
	a, err := openServerAt(t, conf, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openServerAt(t, conf, t.TempDir(), nil)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), a.URL()) {
		t.Fatalf("second server on one database: %v, want a conflict naming %s", err, a.URL())
	}
	a.Close()
	if _, err := openServerAt(t, conf, t.TempDir(), nil); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}

// pgSchemaURL returns url aimed at a fresh schema (search_path), dropped
// when t ends.
func pgSchemaURL(t *testing.T, url string) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	schema := "arbiter_e2e_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			conn.Close(ctx)
		}
	})
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// TestHistoryZeroEndToEnd is finding 6: allocations.history = 0 keeps no
// destroyed allocation (the engine used to take 0 for its default, 1200).
func TestHistoryZeroEndToEnd(t *testing.T) {
	_, url := startServer(t, twoHosts+"\n[allocations]\nhistory = 0\n", nil)
	a := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--keepalive", "never")
	cliJSON[arbiter.Allocation](t, url, "release", fmt.Sprint(a.ID))
	if all := cliJSON[[]arbiter.Allocation](t, url, "ps", "--all"); len(all) != 0 {
		t.Fatalf("history = 0 kept %d destroyed allocations: %+v", len(all), all)
	}
}

// signInCookie signs in through the dashboard's form, as a browser on the
// page does, and returns the session cookie.
func signInCookie(t *testing.T, url, token string) *http.Cookie {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/ui/login", strings.NewReader("token="+token))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "arbiter_session" && c.Value != "" {
			return c
		}
	}
	t.Fatalf("sign-in: %d, no session cookie", resp.StatusCode)
	return nil
}

// Secrets of the trust tests' tokens.
const (
	trustOps   = "ops-secret-0123456789abcdef"
	trustAlice = "alice-secret-0123456789abcd"
	trustBob   = "bob-secret-0123456789abcdef"
	trustAgent = "agent-secret-0123456789abcd"
	trustOp    = "operator-secret-0123456789a"
)

// trustTokens configures ops (admin), alice and bob (users; bob by his
// secret's SHA-256 only) and gpu-agent (agent), in files in dir.
func trustTokens(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	for _, tk := range []struct{ name, role, secret string }{
		{"ops", "admin", trustOps}, {"alice", "user", trustAlice}, {"gpu-agent", "agent", trustAgent},
	} {
		f := filepath.Join(dir, tk.name+".token")
		if err := os.WriteFile(f, []byte(tk.secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "\n[[tokens]]\nname = %q\nrole = %q\ntoken_file = %q\n", tk.name, tk.role, f)
	}
	sum := sha256.Sum256([]byte(trustBob))
	fmt.Fprintf(&b, "\n[[tokens]]\nname = \"bob\"\nrole = \"user\"\ntoken_sha256 = %q\n", hex.EncodeToString(sum[:]))
	return b.String()
}

// cmdAs runs a client command in-process with token as ARBITER_TOKEN.
func cmdAs(t *testing.T, url, token string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		switch k {
		case "ARBITER_URL":
			return url
		case "ARBITER_TOKEN":
			return token
		case "USER":
			return "tester"
		}
		return ""
	}}
	code := run(context.Background(), env, args)
	return out.String(), errb.String(), code
}

// httpDo sends one request and returns the status and body.
func httpDo(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestOwnersCannotBeForged is finding 3 end to end: bob allocating "as
// alice" holds it himself (alice is only its label), alice cannot keep it
// alive or release it, and schedules are their registrar's.
func TestOwnersCannotBeForged(t *testing.T) {
	_, url := startServer(t, twoHosts+trustTokens(t, t.TempDir()), nil)
	out, errs, code := cmdAs(t, url, trustBob, "alloc", "--gpus", "1", "--owner", "alice", "--keepalive", "60", "-o", "json")
	if code != 0 {
		t.Fatalf("alloc: %d %s", code, errs)
	}
	var a arbiter.Allocation
	json.Unmarshal([]byte(out), &a)
	if a.Owner != "bob" || a.Label != "alice" || a.Principal != "bob" {
		t.Fatalf("bob's alloc --owner alice: owner %q label %q, want bob with the label alice", a.Owner, a.Label)
	}
	ps, _, _ := cmdAs(t, url, trustAlice, "ps")
	if !strings.Contains(ps, "LABEL") || !regexp.MustCompile(`(?m)^\d+\s+bob\s+alice\s`).MatchString(ps) {
		t.Fatalf("ps does not show bob as the owner and alice as the label:\n%s", ps)
	}
	id := fmt.Sprint(a.ID)
	if _, errs, code := cmdAs(t, url, trustAlice, "keepalive", id); code == 0 || !strings.Contains(errs, `belongs to "bob"`) {
		t.Fatalf("alice keeping bob's allocation alive: %d %s", code, errs)
	}
	if status, body := httpDo(t, "POST", url+"/api/v1/allocations/"+id+"/keepalive", "", "Authorization", "Bearer "+trustAlice); status != 403 {
		t.Fatalf("keepalive of another's allocation: %d %s, want 403", status, body)
	}
	if _, _, code := cmdAs(t, url, trustAlice, "release", id); code == 0 {
		t.Fatal("alice released bob's allocation")
	}
	if _, errs, code := cmdAs(t, url, trustBob, "keepalive", id); code != 0 {
		t.Fatalf("bob keeping his own alive: %s", errs)
	}
	// Schedules: alice's, not bob's to overwrite or delete; ops may.
	if _, errs, code := cmdAs(t, url, trustAlice, "schedules", "add", "--id", "nightly", "--name", "nightly eval"); code != 0 {
		t.Fatalf("schedule: %s", errs)
	}
	if _, _, code := cmdAs(t, url, trustBob, "schedules", "add", "--id", "nightly", "--name", "hijacked"); code == 0 {
		t.Fatal("bob overwrote alice's schedule")
	}
	if status, _ := httpDo(t, "DELETE", url+"/api/schedule/nightly", "", "Authorization", "Bearer "+trustBob); status != 403 {
		t.Fatalf("bob deleting alice's schedule through /api/schedule: %d, want 403", status)
	}
	if status, _ := httpDo(t, "DELETE", url+"/api/v1/schedules/nightly", "", "Authorization", "Bearer "+trustOps); status != 200 {
		t.Fatalf("an admin deleting it: %d", status)
	}
}

// TestHostileTextRefused is finding 4 end to end: text that would drive a
// terminal is refused with a 400 naming the field, changes nothing, and so
// never reaches `arbiter ps` or `arbiter tasks list`.
func TestHostileTextRefused(t *testing.T) {
	dir := t.TempDir()
	man := filepath.Join(dir, "m.toml")
	os.WriteFile(man, []byte("[[jobs]]\nmodel = \"m\"\nmode = \"a\"\ncommand = [\"true\"]\n"), 0o600)
	_, url := startServer(t, twoHosts+trustTokens(t, dir)+"\n[tasks]\nmanifest = \""+man+"\"\n", nil)
	evil := `bob\u001b[2J\u001b[31mFAKE\nroot gpu0 ready`
	auth := []string{"Authorization", "Bearer " + trustOps, "Content-Type", "application/json"}
	before, _ := httpDo(t, "GET", url+"/api/v1/health", "")
	_ = before
	for _, c := range []struct{ method, path, body, field string }{
		{"POST", "/api/v1/allocations", `{"gpus": 1, "label": "` + evil + `"}`, "label"},
		{"POST", "/api/v1/machines", `{"name": "h1", "cuda": "` + strings.Repeat("9", 100<<10) + `"}`, "cuda"},
		{"POST", "/api/v1/locks/l1", `{"holder": "` + evil + `", "ttl_s": 60}`, "holder"},
		{"POST", "/api/v1/schedules", `{"name": "` + evil + `"}`, "name"},
	} {
		status, body := httpDo(t, c.method, url+c.path, c.body, auth...)
		if status != 400 || !strings.Contains(body, c.field) {
			t.Errorf("%s %s: %d %s, want 400 naming %s", c.method, c.path, status, arbiter.Clip(body, 300), c.field)
		}
	}
	if ps, _, _ := cmdAs(t, url, trustOps, "ps", "--all"); !strings.Contains(ps, "no allocations") {
		t.Fatalf("a refused allocation is listed:\n%s", ps)
	}
	// A fleet worker's failure message (a log's tail) is taken, escaped:
	// nothing of it drives a terminal.
	agent := []string{"Authorization", "Bearer " + trustAgent, "X-Lab-Host", "w1"}
	status, body := httpDo(t, "POST", url+"/v1/job/claim", `{}`, agent...)
	var claim struct {
		JobID string `json:"job_id"`
	}
	if json.Unmarshal([]byte(body), &claim); status != 200 || claim.JobID == "" {
		t.Fatalf("claim: %d %s", status, body)
	}
	if status, body := httpDo(t, "POST", url+"/v1/job/"+claim.JobID+"/fail", `{"error": "`+evil+`"}`, agent...); status != 200 {
		t.Fatalf("fail with escapes: %d %s, want 200", status, body)
	}
	for _, cmd := range [][]string{{"tasks", "list"}, {"tasks", "show", claim.JobID[:8]}} {
		if out, errs, _ := cmdAs(t, url, trustOps, cmd...); strings.ContainsAny(out+errs, "\x1b") {
			t.Fatalf("%v shows the error unescaped:\n%q", cmd, out+errs)
		}
	}
}

// serve runs an opened server until the test ends, or until stop, and
// returns its URL.
func serve(t *testing.T, m *serverMain) (url string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return m.URL(), stop
}

// testPKI is a CA with a server certificate for 127.0.0.1 and client
// certificates, written as PEM files into a directory.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "arbiter test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &testPKI{dir: t.TempDir(), ca: ca, caKey: key, serial: 1}
	p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue writes a certificate for cn (server: for 127.0.0.1) and its key;
// it returns their paths.
func (p *testPKI) issue(t *testing.T, cn string, server bool, dns ...string) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	return p.write(t, cn+".pem", "CERTIFICATE", der), p.write(t, cn+".key", "PRIVATE KEY", kder)
}

// client returns an HTTPS client trusting the CA, with cn's certificate
// when cn is not "".
func (p *testPKI) client(t *testing.T, cn string) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	c := &tls.Config{RootCAs: pool}
	if cn != "" {
		cf, kf := p.issue(t, cn, false)
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
}

func doWith(t *testing.T, c *http.Client, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// trustManifest writes a manifest of n no-op tasks.
func trustManifest(t *testing.T, dir string, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("[defaults]\ncommand = [\"python3\", \"-c\", \"import os; open(os.path.join(os.environ['ARBITER_OUTPUT_DIR'], 'w.txt'), 'w').write('ok')\"]\nmax_attempts = 1\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[[jobs]]\nmodel = \"m\"\nmode = \"m%d\"\n", i)
	}
	path := filepath.Join(dir, "m.toml")
	os.WriteFile(path, []byte(b.String()), 0o600)
	return path
}

// TestFleetWorkerAPIAuthenticated is finding 2 end to end: with tokens
// configured, /v1 worker calls need a client certificate naming their
// X-Lab-Host, or an agent token — else 401 in the fleet's form; the
// operator needs its token (loopback is not enough); and the stdlib Python
// worker works unchanged with either credential.
func TestFleetWorkerAPIAuthenticated(t *testing.T) {
	dir := t.TempDir()
	pki := newTestPKI(t)
	srvCert, srvKey := pki.issue(t, "arbiter-server", true)
	conf := "[server]\nlocal = false\ntls_cert_file = \"" + srvCert + "\"\ntls_key_file = \"" + srvKey + "\"\ntls_client_ca = \"" +
		filepath.Join(pki.dir, "ca.pem") + "\"\n[tasks]\nmanifest = \"" + trustManifest(t, dir, 4) + "\"\n" + trustTokens(t, dir)
	m, err := openServerAt(t, conf, filepath.Join(dir, "data"), func(k string) string {
		if k == "ARBITER_OPERATOR_TOKEN" {
			return trustOp
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	url, _ := serve(t, m)
	anon := pki.client(t, "")
	fleetErr := regexp.MustCompile(`^\{"error":"[^"]+"\}\s*$`)
	// No credentials: 401, in the fleet's error form, and nothing changes.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/job/claim", `{"capability":{"hostname":"gpu0","cuda":true}}`},
		{"GET", "/v1/jobs", ""},
		{"GET", "/v1/workers", ""},
		{"POST", "/v1/job/" + strings.Repeat("a", 64) + "/fail", `{"error":"x"}`},
		{"POST", "/v1/job/" + strings.Repeat("a", 64) + "/cancel", ""}, // loopback, no operator token
	} {
		status, body := doWith(t, anon, c.method, url+c.path, c.body, "X-Lab-Host", "gpu0")
		if status != 401 || !fleetErr.MatchString(body) {
			t.Errorf("%s %s without credentials: %d %s, want 401 {\"error\": …}", c.method, c.path, status, body)
		}
	}
	// A user token is not a worker's.
	if status, _ := doWith(t, anon, "POST", url+"/v1/job/claim", `{}`, "X-Lab-Host", "gpu0", "Authorization", "Bearer "+trustAlice); status != 403 {
		t.Errorf("claim with a user token: %d, want 403", status)
	}
	// A certificate names its host: for another X-Lab-Host, 403.
	pi := pki.client(t, "pi-worker")
	if status, body := doWith(t, pi, "POST", url+"/v1/job/claim", `{}`, "X-Lab-Host", "gpu0"); status != 403 || !strings.Contains(body, "pi-worker") {
		t.Errorf("certificate for pi-worker claiming as gpu0: %d %s, want 403", status, body)
	}
	if status, body := doWith(t, anon, "POST", url+"/v1/job/"+strings.Repeat("a", 64)+"/cancel", "", "X-Operator-Token", trustOp); status != 200 {
		t.Errorf("cancel with the operator token: %d %s", status, body)
	}
	// The Python worker, unchanged, with a certificate, then with a token.
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	script, _ := filepath.Abs(filepath.Join("testdata", "fleet_worker.py"))
	certFile, keyFile := pki.issue(t, "py-cert", false)
	for _, w := range []struct{ host, env string }{
		{"py-cert", "FLEET_CERT=" + certFile + "\x00FLEET_KEY=" + keyFile},
		{"py-token", "FLEET_TOKEN=" + trustAgent},
	} {
		cmd := exec.Command(py, script, url, w.host, "2")
		cmd.Env = append(os.Environ(), "FLEET_CA="+filepath.Join(pki.dir, "ca.pem"))
		cmd.Env = append(cmd.Env, strings.Split(w.env, "\x00")...)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Count(string(out), `"result": "completed"`) != 2 {
			t.Fatalf("python worker %s: %v\n%s", w.host, err, out)
		}
	}
}

// TestFleetOpenWorkerAPI: [tasks] open_worker_api = true lets workers in
// on X-Lab-Host alone (logged at start), without registering their hosts;
// the operator still needs its token.
func TestFleetOpenWorkerAPI(t *testing.T) {
	dir := t.TempDir()
	_, url := startServer(t, "[server]\nlocal = false\n[tasks]\nopen_worker_api = true\nmanifest = \""+trustManifest(t, dir, 1)+"\"\n"+trustTokens(t, dir), nil)
	if status, body := httpDo(t, "POST", url+"/v1/job/claim", `{"capability": {"cuda": true, "gpus": [{"index": 0, "vram_gib": 24, "uuid": "GPU-q"}]}}`, "X-Lab-Host", "gpu9"); status != 200 || !strings.Contains(body, "job_id") {
		t.Fatalf("claim on the open worker API: %d %s", status, body)
	}
	if out, errs, code := cmdAs(t, url, trustOps, "status", "-o", "json"); code != 0 || strings.Contains(out, "gpu9") {
		t.Fatalf("X-Lab-Host alone registered a machine: %s %s", out, errs)
	}
	if status, _ := httpDo(t, "POST", url+"/v1/manifest/reload", "", "X-Lab-Host", "gpu9"); status != 401 {
		t.Fatalf("operator call on the open worker API: %d, want 401", status)
	}
}

// whoamiWith asks who the server takes a request with cookie for.
func whoamiWith(t *testing.T, url string, cookie *http.Cookie) (int, string) {
	t.Helper()
	return httpDo(t, "GET", url+"/api/v1/whoami", "", "Cookie", cookie.Name+"="+cookie.Value)
}

// TestDashboardSessions is finding 7 end to end: the cookie is an opaque
// session the server keeps — it survives a restart, ends on log out, and
// ends at once when its token is removed or changed by a reload.
func TestDashboardSessions(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	conf := twoHosts + trustTokens(t, dir)
	m, err := openServerAt(t, conf, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	url, stop := serve(t, m)
	alice := signInCookie(t, url, trustAlice)
	if strings.Contains(alice.Value, trustAlice) || len(alice.Value) < 32 {
		t.Fatalf("cookie %q: want an opaque session id", alice.Value)
	}
	if status, body := whoamiWith(t, url, alice); status != 200 || !strings.Contains(body, `"name":"alice"`) || !strings.Contains(body, `"auth":"cookie"`) {
		t.Fatalf("whoami with the cookie: %d %s", status, body)
	}
	// A restart keeps the session.
	stop()
	m2, err := openServerAt(t, conf, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	url, _ = serve(t, m2)
	if status, _ := whoamiWith(t, url, alice); status != 200 {
		t.Fatalf("after a restart: %d, want the session kept", status)
	}
	// Log out ends it, on the server: the same cookie no longer works.
	req, _ := http.NewRequest("POST", url+"/ui/logout", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(alice)
	if resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if status, _ := whoamiWith(t, url, alice); status != 401 {
		t.Fatalf("after log out: %d, want 401", status)
	}
	// A token removed by a reload: its bearer use and its sessions end at once.
	bob := signInCookie(t, url, trustBob)
	ops := signInCookie(t, url, trustOps)
	cfgPath := m2.cfg.Path
	text, _ := os.ReadFile(cfgPath)
	i := strings.Index(string(text), "\n[[tokens]]\nname = \"bob\"")
	if err := os.WriteFile(cfgPath, text[:i], 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := cmdAs(t, url, trustOps, "reload"); code != 0 {
		t.Fatalf("reload: %s %s", out, errs)
	}
	if status, _ := whoamiWith(t, url, bob); status != 401 {
		t.Fatalf("bob's session after his token was removed: %d, want 401", status)
	}
	if _, _, code := cmdAs(t, url, trustBob, "ps"); code == 0 {
		t.Fatal("bob's token works after it was removed")
	}
	if status, _ := whoamiWith(t, url, ops); status != 200 {
		t.Fatalf("ops's session after a reload that kept ops: %d", status)
	}
	// ops's secret changed: its session ends, the new secret works.
	newOps := "ops-secret-rotated-0123456789"
	os.WriteFile(filepath.Join(dir, "ops.token"), []byte(newOps), 0o600)
	if _, errs, code := cmdAs(t, url, trustOps, "reload"); code != 0 {
		t.Fatalf("reload: %s", errs)
	}
	if status, _ := whoamiWith(t, url, ops); status != 401 {
		t.Fatalf("a session of a changed token: %d, want 401", status)
	}
	if _, errs, code := cmdAs(t, url, newOps, "ps"); code != 0 {
		t.Fatalf("the new secret: %s", errs)
	}
}

// TestAuditTrail: admin actions and refused requests are in the trail, with
// who, from where and what; a flood of refusals is folded into a bounded
// number of entries; only admins may read it.
func TestAuditTrail(t *testing.T) {
	_, url := startServer(t, twoHosts+trustTokens(t, t.TempDir()), nil)
	if _, errs, code := cmdAs(t, url, trustOps, "drain", "gpu1"); code != 0 {
		t.Fatalf("drain: %s", errs)
	}
	httpDo(t, "GET", url+"/api/v1/machines", "", "Authorization", "Bearer wrong-token-0123456789")
	httpDo(t, "POST", url+"/api/v1/machines/gpu1/undrain", "", "Authorization", "Bearer "+trustAlice)
	for i := 0; i < 300; i++ { // a flood
		httpDo(t, "GET", url+"/api/v1/allocations", "", "Authorization", fmt.Sprintf("Bearer guess-%d-0123456789", i))
	}
	if _, errs, code := cmdAs(t, url, trustAlice, "audit"); code == 0 || !strings.Contains(errs, "admin") {
		t.Fatalf("a user reading the audit trail: %d %s", code, errs)
	}
	var es []arbiter.AuditEntry
	out, errs, code := cmdAs(t, url, trustOps, "audit", "--limit", "1000", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &es) != nil {
		t.Fatalf("audit: %d %s", code, errs)
	}
	var drain, wrong, forbidden, folded bool
	refusedEntries, refusals := 0, 0
	for _, e := range es {
		switch {
		case e.Kind == arbiter.AuditAction && e.Action == "POST /api/v1/machines/{name}/drain":
			drain = e.Principal == "ops" && e.Address == "127.0.0.1" && e.Status == 200 && !e.Time.IsZero()
		case e.Kind == arbiter.AuditRefused && e.Status == 403 && e.Principal == "alice":
			forbidden = true
		case e.Kind == arbiter.AuditRefused && e.Status == 401 && e.Action == "GET /api/v1/machines":
			wrong = e.Address == "127.0.0.1"
		}
		if e.Kind == arbiter.AuditRefused {
			refusedEntries++
			refusals += max(e.Count, 1)
			folded = folded || e.Count > 1
		}
	}
	if !drain || !wrong || !forbidden {
		t.Fatalf("drain %v, wrong token %v, forbidden %v in:\n%+v", drain, wrong, forbidden, es)
	}
	if refusals < 302 || refusedEntries > 80 || !folded {
		t.Fatalf("%d refusals in %d entries (folded %v): want all counted, in at most 80 entries", refusals, refusedEntries, folded)
	}
	t.Logf("302 refusals kept as %d audit entries", refusedEntries)
}

// TestManifestSetOnReload is finding 9: [tasks] manifest added to the
// configuration of a running server is loaded by `arbiter reload` and by
// `arbiter tasks reload` (which used to say none was configured).
func TestManifestSetOnReload(t *testing.T) {
	dir := t.TempDir()
	m, url := startServer(t, "[server]\nlocal = false\n"+trustTokens(t, dir), nil)
	if _, errs, code := cmdAs(t, url, trustOps, "tasks", "reload"); code == 0 || !strings.Contains(errs, m.cfg.Path) {
		t.Fatalf("tasks reload without a manifest: %d %s, want an error naming the file to set it in", code, errs)
	}
	man := trustManifest(t, dir, 3)
	text, _ := os.ReadFile(m.cfg.Path)
	os.WriteFile(m.cfg.Path, append(text, []byte("\n[tasks]\nmanifest = \""+man+"\"\n")...), 0o600)
	if out, errs, code := cmdAs(t, url, trustOps, "tasks", "reload"); code != 0 || !strings.Contains(out, "3 tasks") {
		t.Fatalf("tasks reload after setting [tasks] manifest: %d %s %s", code, out, errs)
	}
	// And `arbiter reload` follows a change of path.
	dir2 := t.TempDir()
	man2 := trustManifest(t, dir2, 5)
	os.WriteFile(m.cfg.Path, append(text, []byte("\n[tasks]\nmanifest = \""+man2+"\"\n")...), 0o600)
	if out, errs, code := cmdAs(t, url, trustOps, "reload"); code != 0 || !strings.Contains(out, "task manifest") {
		t.Fatalf("reload: %d %s %s", code, out, errs)
	}
	if out, _, _ := cmdAs(t, url, trustOps, "tasks", "status"); !strings.Contains(out, man2) {
		t.Fatalf("tasks status after reload does not name the new manifest:\n%s", out)
	}
}

// TestSlowClientsCut is finding 5 end to end, on the real server and on
// the spalloc port: a POST announcing 100 bytes that sends one is cut after
// body_timeout_s; connections past max_conns_per_client from one address
// are closed as they come; an event stream is not cut.
func TestSlowClientsCut(t *testing.T) {
	port := freePort(t)
	m, url := startServer(t, twoHosts+"\n[server]\nbody_timeout_s = 1\nmax_conns_per_client = 8\nspalloc_listen = \"127.0.0.1:"+port+"\"\n[spalloc]\nmax_conns_per_client = 4\n", nil)
	addr := strings.TrimPrefix(url, "http://")

	// Slow loris: headers, one byte of 100, nothing more.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	fmt.Fprintf(c, "POST /api/v1/allocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	cut := time.Since(start)
	if err == nil {
		resp.Body.Close()
	}
	if cut > 5*time.Second {
		t.Fatalf("a body of 1 byte in 100 held the connection %s (body_timeout_s = 1)", cut)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the slow connection is still open")
	}
	t.Logf("slow body cut after %s (body_timeout_s = 1)", cut.Round(time.Millisecond))

	// An event stream outlives body_timeout_s.
	req, _ := http.NewRequest("GET", url+"/api/v1/events", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	sresp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	// An event 1.5s in, past body_timeout_s.
	later := time.AfterFunc(1500*time.Millisecond, func() {
		m.loop.Do(context.Background(), arbiter.SetDraining{Name: "gpu1", Draining: true})
	})
	defer later.Stop()
	sc := bufio.NewScanner(sresp.Body)
	gotEvent := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "machine.drain") {
			gotEvent = true
			break
		}
	}
	sresp.Body.Close()
	if !gotEvent {
		t.Fatal("the event stream was cut before an event 1.5s in (body_timeout_s = 1)")
	}

	// Connections per client: 8 held; the next 8 are closed at once. The
	// connections above are closed first, on the server too.
	http.DefaultClient.CloseIdleConnections()
	limited := m.listener.(*connlimit.Listener)
	poll.Until(t, 30*time.Second, "the server to see this test's connections closed", func() bool {
		return limited.Open(netip.MustParseAddr("127.0.0.1")) == 0
	})
	held := openConns(t, addr, 16)
	if len(held) != 8 {
		t.Fatalf("%d of 16 connections stayed open, want 8 (max_conns_per_client)", len(held))
	}
	for _, h := range held {
		h.Close()
	}
	// Room again once they are closed.
	poll.Until(t, 30*time.Second, "room for a connection again", func() bool { return len(openConns(t, addr, 1)) == 1 })
	// The spalloc port: 4.
	if held := openConns(t, "127.0.0.1:"+port, 10); len(held) != 4 {
		t.Fatalf("spalloc: %d of 10 connections stayed open, want 4", len(held))
	}
}

// openConns dials n connections and returns those the server keeps open
// (a read that times out) rather than closes (a read that ends at once).
func openConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var all []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		all = append(all, c)
	}
	// Read them all at once: a closed one ends at once, an open one times out.
	deadline := time.Now().Add(500 * time.Millisecond)
	kept := make([]bool, len(all))
	var wg sync.WaitGroup
	for i, c := range all {
		c.SetReadDeadline(deadline)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			kept[i] = errors.As(err, &ne) && ne.Timeout()
		}()
	}
	wg.Wait()
	var open []net.Conn
	for i, c := range all {
		if kept[i] {
			open = append(open, c)
		} else {
			c.Close()
		}
	}
	return open
}

// TestLostLeaseStopsServer is finding 1's other half on PostgreSQL: a
// server whose lease is taken over stops, instead of writing beside the
// new holder.
func TestLostLeaseStopsServer(t *testing.T) {
	pgURL := os.Getenv("ARBITER_TEST_POSTGRES")
	if pgURL == "" {
		t.Skip("ARBITER_TEST_POSTGRES is not set")
	}
	db := pgSchemaURL(t, pgURL)
	m, err := openServerAt(t, twoHosts+"\n[server]\nlease_ttl_s = 1\ndatabase = \""+db+"\"\n", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(context.Background()) }()
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE leader_lease SET term = term + 1, holder = 'the other server', expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "the other server") {
			t.Fatalf("Run: %v, want an error naming the new holder", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the server goes on after losing its lease")
	}
}

// TestRedact: no form of a database password reaches the log.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://arb:s3cret@db:5432/arb":                         "postgres://arb:xxxxx@db:5432/arb",
		"postgres://arb@db/arb?password=s3cret&sslmode=disable":     "postgres://arb@db/arb?password=xxxxx&sslmode=disable",
		"postgres://db/arb?sslpassword=s3cret":                      "postgres://db/arb?sslpassword=xxxxx",
		"host=db user=arb password=s3cret dbname=arb":               "host=db user=arb password=xxxxx dbname=arb",
		"host=db password = 'a b\\' s3cret' sslpassword=s3cret x=1": "host=db password = xxxxx sslpassword=xxxxx x=1",
		"/var/lib/arbiter/arbiter.db":                               "/var/lib/arbiter/arbiter.db",
	} {
		if got := redact(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEventsKeepWebhooksFromUsers: a webhook's URL (often a credential)
// and another's notification subscription reach neither a user nor an
// agent through the event log or the dashboard's events panel; the admin
// reads them all, and a user its own subscription's.
func TestEventsKeepWebhooksFromUsers(t *testing.T) {
	_, url := startServer(t, twoHosts+trustTokens(t, t.TempDir()), nil)
	bearer := func(tok string) []string {
		return []string{"Authorization", "Bearer " + tok, "Content-Type", "application/json"}
	}
	if st, b := httpDo(t, "POST", url+"/api/v1/webhooks", `{"url":"https://hooks.example.com/T0/ADMIN-SECRET","kinds":["swap.*"]}`, bearer(trustOps)...); st != 201 {
		t.Fatalf("admin webhook: %d %s", st, b)
	}
	if st, b := httpDo(t, "POST", url+"/api/v1/notifications", `{"url":"https://hooks.slack.com/T1/ALICE-SECRET","format":"slack","kinds":["allocation.ready"]}`, bearer(trustAlice)...); st != 201 {
		t.Fatalf("alice's subscription: %d %s", st, b)
	}
	read := func(tok string) string {
		_, list := httpDo(t, "GET", url+"/api/v1/events?stream=false&since=0", "", bearer(tok)...)
		_, panel := httpDo(t, "GET", url+"/ui/panels?p=events", "", bearer(tok)...)
		return list + panel
	}
	for who, tok := range map[string]string{"bob": trustBob, "the agent": trustAgent} {
		if got := read(tok); strings.Contains(got, "ADMIN-SECRET") || strings.Contains(got, "ALICE-SECRET") {
			t.Errorf("%s reads a webhook URL from the events", who)
		}
	}
	if got := read(trustAlice); !strings.Contains(got, "ALICE-SECRET") || strings.Contains(got, "ADMIN-SECRET") {
		t.Errorf("alice's events: her own subscription %v, the admin's webhook %v", strings.Contains(got, "ALICE-SECRET"), strings.Contains(got, "ADMIN-SECRET"))
	}
	if got := read(trustOps); !strings.Contains(got, "ALICE-SECRET") || !strings.Contains(got, "ADMIN-SECRET") {
		t.Error("the admin does not read every webhook event")
	}
}
