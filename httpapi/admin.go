package httpapi

import (
	"context"
	"net/http"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
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
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
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
	httpio.WriteJSON(w, http.StatusOK, struct {
		Reloaded []string `json:"reloaded"`
	}{done})
	return nil
}
