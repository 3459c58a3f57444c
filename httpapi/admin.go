package httpapi

import (
	"context"
	"net/http"

	"github.com/arbiter-hq/arbiter"
)

// AdminOptions configure the administration routes.
type AdminOptions struct {
	// Reload reads the configuration again and applies what can change
	// while running (POST /api/v1/admin/reload), as SIGHUP does. It returns
	// the parts reloaded; its error (an *arbiter.Error, invalid when the
	// file does not load) says what failed, the previous configuration
	// staying in force. Nil: reloading answers 404.
	Reload func(ctx context.Context) ([]string, error)
}

func (s *Server) handleAdminReload(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := srvOnlyParams(r.URL.Query()); err != nil {
		return err
	}
	if s.admin.Reload == nil {
		return arbiter.Errorf(arbiter.ENotFound, "this server has no configuration file to reload: start it with --config")
	}
	done, err := s.admin.Reload(r.Context())
	if err != nil {
		return err
	}
	if done == nil {
		done = []string{}
	}
	srvWriteJSON(w, http.StatusOK, struct {
		Reloaded []string `json:"reloaded"`
	}{done})
	return nil
}

// Reload makes the server read its configuration again, as SIGHUP does
// (admin), and returns the parts reloaded. Errors: invalid (with the file's
// problem: file, line, key) when the file does not load, nothing changed
// then; not_found when the server runs without a configuration file.
func (c *Client) Reload(ctx context.Context) ([]string, error) {
	var out struct {
		Reloaded []string `json:"reloaded"`
	}
	err := c.do(ctx, http.MethodPost, "/api/v1/admin/reload", nil, nil, &out)
	return out.Reloaded, err
}
