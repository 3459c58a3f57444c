package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testRequest is httptest.NewRequest addressed to 127.0.0.1, as a local
// client's request is: a server without tokens answers only requests
// addressed to a loopback name (checkHost).
func testRequest(method, target string, body io.Reader) *http.Request {
	r := httptest.NewRequest(method, target, body)
	r.Host = "127.0.0.1:7070"
	return r
}
