package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// The training fleet's /v1 API (docs/reference/fleet.md §3): the paths, status
// codes and bodies existing workers and operator tools use, as thin
// adapters onto the same commands as the native API. Errors have the
// fleet's form {"error": "message"}, not the native one.
//
// Worker endpoints name the worker by X-Lab-Host; who may claim to be that
// host is authenticated before the handler runs (auth.go): a TLS client
// certificate naming it, an agent token, or nothing when the open worker
// API is on. Operator endpoints need X-Operator-Token or an admin token.

// fleetJob is one row of GET /v1/jobs.
type fleetJob struct {
	JobID       string     `json:"job_id"`
	Name        string     `json:"name"`
	Model       string     `json:"model"`
	Mode        string     `json:"mode"`
	Priority    int        `json:"priority"`
	Status      string     `json:"status"`
	ClaimedBy   *string    `json:"claimed_by"`
	ClaimedAt   *time.Time `json:"claimed_at"`
	HeartbeatAt *time.Time `json:"heartbeat_at"`
	CompletedAt *time.Time `json:"completed_at"`
	Attempts    int        `json:"attempts"`
	LastError   *string    `json:"last_error"`
	ArtifactID  *string    `json:"artifact_id"`
}

// fleetWorker is one row of GET /v1/workers.
type fleetWorker struct {
	Hostname   string             `json:"hostname"`
	FirstSeen  time.Time          `json:"first_seen"`
	LastSeen   time.Time          `json:"last_seen"`
	Capability arbiter.Capability `json:"capability"`
	Machine    string             `json:"machine,omitempty"`
}

// fleetClaim is the answer of a claim that got a job. GPUs, AllocationID
// and CUDAVisibleDevices are additions: what the claim holds.
type fleetClaim struct {
	JobID              string            `json:"job_id"`
	Name               string            `json:"name"`
	Spec               *arbiter.TaskSpec `json:"spec"`
	Attempts           int               `json:"attempts"`
	AllocationID       *int64            `json:"allocation_id"`
	GPUs               []int             `json:"gpus"`
	CUDAVisibleDevices string            `json:"cuda_visible_devices"`
}

func fleetJSON(w http.ResponseWriter, status int, v any) { httpio.WriteJSON(w, status, v) }

func fleetError(w http.ResponseWriter, status int, msg string) {
	fleetJSON(w, status, map[string]string{"error": msg})
}

// fleetOff answers 404 when the server has no work queue.
func (s *Server) fleetOff(w http.ResponseWriter) bool {
	if s.tasks == nil {
		fleetError(w, http.StatusNotFound, "this server has no work queue")
		return true
	}
	return false
}

// fleetHost returns the worker's X-Lab-Host, or answers 400.
func fleetHost(w http.ResponseWriter, r *http.Request) (string, bool) {
	host := strings.TrimSpace(r.Header.Get("X-Lab-Host"))
	if err := arbiter.ValidateName("X-Lab-Host", host); err != nil {
		fleetError(w, http.StatusBadRequest, "X-Lab-Host required: "+arbiter.ErrorMessage(err))
		return "", false
	}
	return host, true
}

// fleetID returns the {job_id} of the path, or answers 400.
func fleetID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := arbiter.ValidateSHA256("job_id", id); err != nil {
		fleetError(w, http.StatusBadRequest, arbiter.ErrorMessage(err))
		return "", false
	}
	return id, true
}

// fleetBody reads a JSON object body, or answers 400 ("body must be JSON").
// Unknown keys are ignored, as the fleet's server did; null is {}.
func (s *Server) fleetBody(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, bool) {
	buf := getBuf()
	defer putBuf(buf)
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, s.maxBody))
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		fleetError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is larger than %d bytes", s.maxBody))
		return nil, false
	case err != nil:
		fleetError(w, http.StatusBadRequest, "body must be JSON: reading it failed")
		return nil, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		fleetError(w, http.StatusBadRequest, "body must be JSON (an object)")
		return nil, false
	}
	return m, true
}

// fleetWorkerError answers err in the fleet's form. A worker call refused
// because the task is not (or no longer) the worker's — a conflict, or an
// unknown id — is 410, as the fleet's workers expect; anything else is
// answered as every error is (writeError: the one status table, unexpected
// errors logged), in the fleet's form under /v1.
func (s *Server) fleetWorkerError(w http.ResponseWriter, r *http.Request, err error) {
	switch arbiter.ErrorCode(err) {
	case arbiter.EConflict, arbiter.ENotFound:
		fleetError(w, http.StatusGone, "job no longer claimed by you: "+arbiter.ErrorMessage(err))
	default:
		s.writeError(w, r, r.URL.Path, err)
	}
}

func (s *Server) handleFleetClaim(w http.ResponseWriter, r *http.Request, caller arbiter.Caller) error {
	if s.fleetOff(w) {
		return nil
	}
	host, ok := fleetHost(w, r)
	if !ok {
		return nil
	}
	body, ok := s.fleetBody(w, r)
	if !ok {
		return nil
	}
	var cp arbiter.Capability
	if raw, ok := body["capability"]; ok {
		if err := json.Unmarshal(raw, &cp); err != nil {
			fleetError(w, http.StatusBadRequest, arbiter.ErrorMessage(err))
			return nil
		}
	}
	c, err := arbiter.Do(r.Context(), s.plane, arbiter.ClaimTask{Worker: host, Capability: cp, RegisterHost: fleetTrusted(caller)})
	if err != nil {
		s.fleetWorkerError(w, r, httpio.ContextError(r.Context(), err))
		return nil
	}
	if c.Task == nil {
		// The fleet's server answered 200 with a sentinel: 204 has no body.
		fleetJSON(w, http.StatusOK, map[string]any{"job": nil})
		return nil
	}
	t := c.Task
	out := fleetClaim{JobID: t.ID, Name: t.Name, Spec: t.Spec, Attempts: t.Attempts, GPUs: t.GPUs}
	if out.GPUs == nil {
		out.GPUs = []int{}
	}
	if t.AllocationID != 0 {
		id := t.AllocationID
		out.AllocationID = &id
	}
	out.CUDAVisibleDevices = fleetDevices(t.GPUs)
	fleetJSON(w, http.StatusOK, out)
	return nil
}

// fleetTrusted reports whether a /v1 worker may have its host registered as
// a machine from its capability: when it proved who it is (a client
// certificate, an agent or admin token) or the server is open to loopback
// callers; never on X-Lab-Host alone (the open worker API).
func fleetTrusted(c arbiter.Caller) bool {
	return c.Role == arbiter.RoleAgent || c.Role == arbiter.RoleAdmin
}

// fleetDevices is CUDA_VISIBLE_DEVICES for GPU indices: "0,2".
func fleetDevices(gpus []int) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = strconv.Itoa(g)
	}
	return strings.Join(parts, ",")
}

// fleetTaskCall checks what every worker call on one task needs — the work
// queue enabled, the worker's X-Lab-Host and a well-formed task id — and
// answers the fleet's error itself when one is missing (ok false).
func (s *Server) fleetTaskCall(w http.ResponseWriter, r *http.Request) (host, id string, ok bool) {
	if s.fleetOff(w) {
		return "", "", false
	}
	if host, ok = fleetHost(w, r); !ok {
		return "", "", false
	}
	if id, ok = fleetID(w, r); !ok {
		return "", "", false
	}
	return host, id, true
}

// fleetDo applies a worker's command and answers {"ok": true}, or the
// fleet's error for what went wrong.
func (s *Server) fleetDo(w http.ResponseWriter, r *http.Request, cmd arbiter.Command) {
	if _, err := s.plane.Do(r.Context(), cmd); err != nil {
		s.fleetWorkerError(w, r, httpio.ContextError(r.Context(), err))
		return
	}
	fleetJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func (s *Server) handleFleetHeartbeat(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	host, id, ok := s.fleetTaskCall(w, r)
	if !ok {
		return nil
	}
	s.fleetDo(w, r, arbiter.TaskHeartbeat{ID: id, Worker: host})
	return nil
}

func (s *Server) handleFleetComplete(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	host, id, ok := s.fleetTaskCall(w, r)
	if !ok {
		return nil
	}
	body, ok := s.fleetBody(w, r)
	if !ok {
		return nil
	}
	var art string
	if raw, ok := body["artifact_id"]; ok {
		if json.Unmarshal(raw, &art) != nil {
			fleetError(w, http.StatusBadRequest, "artifact_id must be a string: the sha256 of the uploaded artifact")
			return nil
		}
	}
	if art == "" {
		fleetError(w, http.StatusBadRequest, "artifact_id required")
		return nil
	}
	s.fleetDo(w, r, arbiter.CompleteTask{ID: id, Worker: host, ArtifactID: strings.ToLower(art)})
	return nil
}

func (s *Server) handleFleetFail(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	host, id, ok := s.fleetTaskCall(w, r)
	if !ok {
		return nil
	}
	body, ok := s.fleetBody(w, r)
	if !ok {
		return nil
	}
	msg := "no error message"
	if raw, ok := body["error"]; ok && !bytes.Equal(raw, []byte("null")) {
		var str string
		if json.Unmarshal(raw, &str) == nil {
			msg = str
		} else {
			msg = string(raw) // the fleet's server kept str(error) of anything
		}
	}
	// The fleet's workers send the tail of a training log: progress bars'
	// carriage returns, colours, any length. The fleet's server kept it as
	// it came; arbiter keeps text, so it is escaped, and its end kept.
	msg = arbiter.ClipStart(arbiter.EscapeText(msg, true), arbiter.MaxTaskErrorInBytes-len("…"))
	s.fleetDo(w, r, arbiter.FailTask{ID: id, Worker: host, Error: msg})
	return nil
}

func (s *Server) handleFleetUpload(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	host, id, ok := s.fleetTaskCall(w, r)
	if !ok {
		return nil
	}
	if _, ok := s.taskByID(id); !ok {
		fleetError(w, http.StatusNotFound, "unknown job_id")
		return nil
	}
	sha := strings.ToLower(strings.TrimSpace(r.Header.Get("X-Content-SHA256")))
	if arbiter.ValidateSHA256("X-Content-SHA256", sha) != nil {
		fleetError(w, http.StatusBadRequest, "X-Content-SHA256 (64 hex) required")
		return nil
	}
	a, existed, err := s.ingest(r, id, host, sha)
	var me *arbiter.ChecksumError
	switch {
	case errors.As(err, &me):
		fleetJSON(w, http.StatusBadRequest, map[string]string{"status": "sha-mismatch", "actual_sha256": me.Actual})
	case arbiter.ErrorCode(err) == arbiter.ETooLarge:
		fleetError(w, http.StatusRequestEntityTooLarge, "artifact exceeds max size: "+arbiter.ErrorMessage(err))
	case arbiter.ErrorCode(err) == arbiter.ENotFound:
		fleetError(w, http.StatusNotFound, "unknown job_id")
	case arbiter.ErrorCode(err) == arbiter.EInvalid:
		fleetError(w, http.StatusBadRequest, arbiter.ErrorMessage(err))
	case err != nil:
		s.fleetWorkerError(w, r, err)
		return nil
	case existed:
		fleetJSON(w, http.StatusOK, map[string]string{"status": "already-present", "artifact_id": a.ID})
	default:
		fleetJSON(w, http.StatusCreated, map[string]any{"status": "stored", "artifact_id": a.ID, "size_bytes": a.SizeBytes})
	}
	return nil
}

func (s *Server) handleFleetJobs(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if s.fleetOff(w) {
		return nil
	}
	status := r.URL.Query().Get("status")
	if err := taskStatus(status); err != nil {
		fleetError(w, http.StatusBadRequest, arbiter.ErrorMessage(err))
		return nil
	}
	ts := s.taskList(func(t *arbiter.Task) bool { return status == "" || t.Status == status })
	jobs := make([]fleetJob, len(ts))
	for i, t := range ts {
		jobs[i] = fleetJob{JobID: t.ID, Name: t.Name, Model: t.Spec.Model, Mode: t.Spec.Mode, Priority: t.Spec.Priority,
			Status: t.Status, ClaimedBy: fleetNull(t.ClaimedBy), ClaimedAt: t.ClaimedAt, HeartbeatAt: t.HeartbeatAt,
			CompletedAt: t.CompletedAt, Attempts: t.Attempts, LastError: fleetNull(t.LastError), ArtifactID: fleetNull(t.ArtifactID)}
	}
	fleetJSON(w, http.StatusOK, map[string]any{"jobs": jobs})
	return nil
}

func fleetNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Server) handleFleetWorkers(w http.ResponseWriter, _ *http.Request, _ arbiter.Caller) error {
	if s.fleetOff(w) {
		return nil
	}
	ws := s.workerList()
	out := make([]fleetWorker, len(ws))
	for i, wk := range ws {
		out[i] = fleetWorker{Hostname: wk.Name, FirstSeen: wk.FirstSeen, LastSeen: wk.LastSeen, Capability: wk.Capability, Machine: wk.Machine}
	}
	fleetJSON(w, http.StatusOK, map[string]any{"workers": out})
	return nil
}

// fleetOperatorCall runs cancel or requeue: {"ok": false} when the task is
// unknown or not in a state that allows it, as the fleet's server did.
func (s *Server) fleetOperatorCall(w http.ResponseWriter, r *http.Request, cmd func(id string) arbiter.Command) error {
	if s.fleetOff(w) {
		return nil
	}
	id, ok := fleetID(w, r)
	if !ok {
		return nil
	}
	drainBody(r)
	_, err := s.plane.Do(r.Context(), cmd(id))
	switch arbiter.ErrorCode(err) {
	case "":
		fleetJSON(w, http.StatusOK, map[string]bool{"ok": true})
	case arbiter.EConflict, arbiter.ENotFound:
		fleetJSON(w, http.StatusOK, map[string]any{"ok": false, "reason": arbiter.ErrorMessage(err)})
	default:
		s.fleetWorkerError(w, r, httpio.ContextError(r.Context(), err))
	}
	return nil
}

func (s *Server) handleFleetCancel(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	return s.fleetOperatorCall(w, r, func(id string) arbiter.Command {
		return arbiter.CancelTask{ID: id, Reason: "by the operator"}
	})
}

func (s *Server) handleFleetRequeue(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	return s.fleetOperatorCall(w, r, func(id string) arbiter.Command { return arbiter.RequeueTask{ID: id} })
}

func (s *Server) handleFleetReload(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if s.fleetOff(w) {
		return nil
	}
	drainBody(r)
	rep, err := s.reloadTasks(r.Context())
	if err != nil {
		if arbiter.ErrorCode(err) == arbiter.EInvalid {
			fleetError(w, http.StatusBadRequest, arbiter.ErrorMessage(err))
		} else {
			s.fleetWorkerError(w, r, err)
		}
		return nil
	}
	fleetJSON(w, http.StatusOK, map[string]any{"ok": true, "n_jobs": rep.Tasks, "counts": map[string]int{
		"added": rep.Added, "updated": rep.Updated, "unchanged": rep.Unchanged, "removed": rep.Removed,
	}})
	return nil
}

func (s *Server) handleFleetHealth(w http.ResponseWriter, _ *http.Request, _ arbiter.Caller) error {
	fleetJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// drainBody reads what little a body-less call sent, so the connection
// can be reused.
func drainBody(r *http.Request) { _, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10)) }
