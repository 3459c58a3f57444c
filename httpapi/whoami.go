package httpapi

import (
	"context"
	"net/http"

	"github.com/arbiter-hq/arbiter"
)

// Whoami is the answer of GET /api/v1/whoami: who the server takes the
// caller for. Auth is "bearer" (an Authorization header), "cookie" (the
// dashboard's sign-in) or "open" (a server without tokens: everyone is an
// anonymous admin).
type Whoami struct {
	Name string `json:"name"`
	Role string `json:"role"`
	Auth string `json:"auth"`
}

func (s *Server) handleWhoami(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := srvOnlyParams(r.URL.Query()); err != nil {
		return err
	}
	auth := "bearer"
	switch {
	case s.open:
		auth = "open"
	case r.Header.Get("Authorization") == "":
		auth = "cookie"
	}
	srvWriteJSON(w, http.StatusOK, Whoami{Name: c.Name, Role: c.Role, Auth: auth})
	return nil
}

// Whoami returns who the server takes the client's token for. Errors:
// unauthorized for a missing or unknown token.
func (c *Client) Whoami(ctx context.Context) (Whoami, error) {
	var out Whoami
	err := c.do(ctx, http.MethodGet, "/api/v1/whoami", nil, nil, &out)
	return out, err
}
