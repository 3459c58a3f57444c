package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// ArtifactStore holds uploaded artifacts, content-addressed by sha256. The
// server sees storage only through this interface (docs/architecture.md §3).
type ArtifactStore interface {
	// Ingest streams r into a blob that must hash to sha and be at most
	// limit bytes. Errors: *arbiter.ChecksumError on a mismatch, too_large
	// past limit; nothing is kept on any error. A blob whose Data is set
	// is durable only once the commit that records it (which carries
	// Data) is.
	Ingest(r io.Reader, sha string, limit int64) (arbiter.Blob, error)
	// Open returns the blob id and its size. Errors: not_found.
	Open(id string) (io.ReadSeekCloser, int64, error)
}

// TaskOptions configure the work queue's endpoints (docs/reference/fleet.md): the
// native ones under /api/v1 (this file) and the fleet's compatible /v1 API
// (fleet.go).
type TaskOptions struct {
	// Artifacts is where uploads go and downloads come from (package
	// artifact in the binary). Required.
	Artifacts ArtifactStore
	// MaxArtifactBytes bounds an upload (default 1 GiB); larger → 413,
	// checked from Content-Length before reading and while streaming.
	MaxArtifactBytes int64
	// OperatorToken is the fleet API's X-Operator-Token. An admin bearer
	// token is accepted as the operator too. Empty: on a server without
	// tokens the /v1 operator endpoints take loopback callers; with tokens,
	// only admin tokens (auth.go).
	OperatorToken string
	// OpenWorkerAPI lets anyone use the /v1 worker endpoints on a server
	// with tokens, naming themselves by X-Lab-Host alone ([tasks]
	// open_worker_api): for workers behind a proxy that authenticates them.
	// Without it they need a client certificate or an agent token.
	OpenWorkerAPI bool
	// Reload reads the manifest again and syncs the queue with it (POST
	// /api/v1/tasks/reload, POST /v1/manifest/reload). Nil: reloading
	// answers that no manifest is configured. Errors it returns that are not
	// *arbiter.Error are shown as they are: they describe the manifest.
	Reload func(ctx context.Context) (arbiter.TaskSyncReport, error)
}

// DefaultMaxArtifactBytes is the upload limit when none is configured.
const DefaultMaxArtifactBytes = 1 << 30

func taskOptions(o *TaskOptions) *TaskOptions {
	if o == nil || o.Artifacts == nil {
		return nil
	}
	c := *o
	if c.MaxArtifactBytes <= 0 {
		c.MaxArtifactBytes = DefaultMaxArtifactBytes
	}
	return &c
}

// taskOff is the error of every work-queue route on a server without it.
func (s *Server) taskOff() error {
	if s.tasks == nil {
		return arbiter.Errorf(arbiter.ENotFound, "this server has no work queue")
	}
	return nil
}

// Reads of the committed records. Task records are *arbiter.Task in the
// read view; a value is accepted too.

func taskFromRecord(v any) (*arbiter.Task, bool) {
	switch t := v.(type) {
	case *arbiter.Task:
		return t, t != nil && t.Spec != nil
	case arbiter.Task:
		return &t, t.Spec != nil
	}
	return nil, false
}

func (s *Server) taskByID(id string) (*arbiter.Task, bool) {
	v, ok := s.plane.Record(arbiter.KindTask, id)
	if !ok {
		return nil, false
	}
	return taskFromRecord(v)
}

// taskList returns the tasks passing keep, in claim order: priority (high
// first), then age.
func (s *Server) taskList(keep func(*arbiter.Task) bool) []*arbiter.Task {
	recs := s.plane.Records(arbiter.KindTask)
	out := make([]*arbiter.Task, 0, len(recs))
	for _, r := range recs {
		if t, ok := taskFromRecord(r.Value); ok && (keep == nil || keep(t)) {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Spec.Priority != out[j].Spec.Priority {
			return out[i].Spec.Priority > out[j].Spec.Priority
		}
		return out[i].Seq < out[j].Seq
	})
	return out
}

func (s *Server) workerList() []arbiter.Worker {
	recs := s.plane.Records(arbiter.KindWorker)
	out := make([]arbiter.Worker, 0, len(recs))
	for _, r := range recs {
		switch w := r.Value.(type) {
		case arbiter.Worker:
			out = append(out, w)
		case *arbiter.Worker:
			out = append(out, *w)
		}
	}
	return out
}

func artifactFromRecord(v any) (arbiter.Artifact, bool) {
	switch a := v.(type) {
	case arbiter.Artifact:
		return a, true
	case *arbiter.Artifact:
		return *a, a != nil
	}
	return arbiter.Artifact{}, false
}

func (s *Server) manifestInfo() *arbiter.TaskManifestInfo {
	v, ok := s.plane.Record(arbiter.KindTaskManifest, arbiter.TaskManifestKey)
	if !ok {
		return nil
	}
	switch m := v.(type) {
	case arbiter.TaskManifestInfo:
		return &m
	case *arbiter.TaskManifestInfo:
		return m
	}
	return nil
}

// taskStatus checks a ?status= value.
func taskStatus(v string) error {
	if v == "" {
		return nil
	}
	for _, st := range arbiter.TaskStatuses {
		if v == st {
			return nil
		}
	}
	return arbiter.Errorf(arbiter.EInvalid, "status %q is not one of %s", arbiter.Clip(v, 40), strings.Join(arbiter.TaskStatuses, ", "))
}

// doTask applies a command whose result is a *arbiter.Task.
func (s *Server) doTask(r *http.Request, cmd arbiter.Typed[*arbiter.Task]) (*arbiter.Task, error) {
	return arbiter.Do(r.Context(), s.plane, cmd)
}

// Native handlers.

func (s *Server) handleTasks(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "status", "worker", "model"); err != nil {
		return err
	}
	status, worker, model := q.Get("status"), q.Get("worker"), q.Get("model")
	if err := taskStatus(status); err != nil {
		return err
	}
	ts := s.taskList(func(t *arbiter.Task) bool {
		return (status == "" || t.Status == status) && (worker == "" || t.ClaimedBy == worker) && (model == "" || t.Spec.Model == model)
	})
	httpio.WriteJSON(w, http.StatusOK, struct {
		Tasks []*arbiter.Task `json:"tasks"`
	}{ts})
	return nil
}

func (s *Server) handleTaskSummary(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	sum := arbiter.TaskSummary{Manifest: s.manifestInfo(), Counts: map[string]int{}, Failed: []arbiter.Task{}}
	for _, st := range arbiter.TaskStatuses {
		sum.Counts[st] = 0
	}
	var failed []*arbiter.Task
	for _, t := range s.taskList(nil) {
		sum.Counts[t.Status]++
		sum.Total++
		if t.Status == arbiter.TaskFailed {
			failed = append(failed, t)
		}
	}
	sort.SliceStable(failed, func(i, j int) bool { return failed[i].UpdatedAt.After(failed[j].UpdatedAt) })
	for i, t := range failed {
		if i == 20 {
			break
		}
		sum.Failed = append(sum.Failed, *t)
	}
	sum.Workers = len(s.plane.Records(arbiter.KindWorker))
	httpio.WriteJSON(w, http.StatusOK, sum)
	return nil
}

func (s *Server) handleTask(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	id, err := taskPathID(r)
	if err != nil {
		return err
	}
	t, ok := s.taskByID(id)
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "task %s does not exist: see GET /api/v1/tasks", id)
	}
	httpio.WriteJSON(w, http.StatusOK, t)
	return nil
}

func taskPathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, arbiter.ValidateSHA256("task id", id)
}

// taskClaimBody is the body of POST /api/v1/tasks/claim.
type taskClaimBody struct {
	Worker     string             `json:"worker"`
	Capability arbiter.Capability `json:"capability"`
	NoCPU      bool               `json:"no_cpu"`
	NoGPU      bool               `json:"no_gpu"`
}

func (s *Server) handleClaimTask(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	var b taskClaimBody
	if err := s.readJSON(w, r, &b); err != nil {
		return err
	}
	c, err := arbiter.Do(r.Context(), s.plane, arbiter.ClaimTask{Worker: b.Worker, Capability: b.Capability, NoCPU: b.NoCPU, NoGPU: b.NoGPU,
		RegisterHost: true}) // the caller has the agent or admin role
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, c)
	return nil
}

// readJSON reads and strictly decodes a JSON body.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	return decodeJSON(buf.Bytes(), v)
}

type taskWorkerBody struct {
	Worker      string `json:"worker"`
	Claim       int64  `json:"claim"`
	ArtifactID  string `json:"artifact_id"`
	Error       string `json:"error"`
	Interrupted bool   `json:"interrupted"`
}

// taskWorkerCall decodes the body of a worker's call on task {id}.
func (s *Server) taskWorkerCall(w http.ResponseWriter, r *http.Request) (string, taskWorkerBody, error) {
	var b taskWorkerBody
	if err := s.taskOff(); err != nil {
		return "", b, err
	}
	id, err := taskPathID(r)
	if err != nil {
		return "", b, err
	}
	if err := s.readJSON(w, r, &b); err != nil {
		return "", b, err
	}
	return id, b, arbiter.ValidateName("worker", b.Worker)
}

func (s *Server) answerTask(w http.ResponseWriter, r *http.Request, cmd arbiter.Typed[*arbiter.Task]) error {
	t, err := s.doTask(r, cmd)
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, t)
	return nil
}

func (s *Server) handleTaskHeartbeat(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id, b, err := s.taskWorkerCall(w, r)
	if err != nil {
		return err
	}
	return s.answerTask(w, r, arbiter.TaskHeartbeat{ID: id, Worker: b.Worker, Claim: b.Claim})
}

func (s *Server) handleCompleteTask(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id, b, err := s.taskWorkerCall(w, r)
	if err != nil {
		return err
	}
	if b.ArtifactID == "" {
		return arbiter.Errorf(arbiter.EInvalid, "artifact_id is missing: upload the result (PUT /api/v1/tasks/%s/artifact) and send its id", id)
	}
	return s.answerTask(w, r, arbiter.CompleteTask{ID: id, Worker: b.Worker, ArtifactID: b.ArtifactID, Claim: b.Claim})
}

func (s *Server) handleFailTask(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id, b, err := s.taskWorkerCall(w, r)
	if err != nil {
		return err
	}
	return s.answerTask(w, r, arbiter.FailTask{ID: id, Worker: b.Worker, Error: b.Error, Claim: b.Claim, Interrupted: b.Interrupted})
}

func (s *Server) handleCancelTask(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	id, err := taskPathID(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "reason"); err != nil {
		return err
	}
	reason := q.Get("reason")
	if len(reason) > maxReasonBytes {
		return arbiter.Errorf(arbiter.EInvalid, "reason is longer than %d bytes", maxReasonBytes)
	}
	if reason == "" {
		reason = "by " + taskCallerName(c)
	}
	return s.answerTask(w, r, arbiter.CancelTask{ID: id, Reason: reason})
}

func taskCallerName(c arbiter.Caller) string {
	if c.Name == "" {
		return "the operator"
	}
	return c.Name
}

func (s *Server) handleRequeueTask(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	id, err := taskPathID(r)
	if err != nil {
		return err
	}
	return s.answerTask(w, r, arbiter.RequeueTask{ID: id})
}

func (s *Server) handleReloadTasks(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	rep, err := s.reloadTasks(r.Context())
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, rep)
	return nil
}

// reloadTasks runs the configured reload. A manifest problem is invalid
// with its own message (file, line, entry, key).
func (s *Server) reloadTasks(ctx context.Context) (arbiter.TaskSyncReport, error) {
	if err := s.taskOff(); err != nil {
		return arbiter.TaskSyncReport{}, err
	}
	if s.tasks.Reload == nil {
		return arbiter.TaskSyncReport{}, arbiter.Errorf(arbiter.EInvalid, "no manifest is configured: set [tasks] manifest in the server's configuration")
	}
	rep, err := s.tasks.Reload(ctx)
	if err != nil {
		var ae *arbiter.Error
		if errors.As(err, &ae) {
			return rep, err
		}
		return rep, arbiter.Errorf(arbiter.EInvalid, "the manifest was not loaded, the one in force stays: %v", err)
	}
	return rep, nil
}

func (s *Server) handleWorkers(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Workers []arbiter.Worker `json:"workers"`
	}{s.workerList()})
	return nil
}

// Artifacts.

// ingest streams r's body into the artifact store for task id, checking
// the announced size first, and records the artifact's metadata. existed
// says whether those bytes were already stored.
func (s *Server) ingest(r *http.Request, id, worker, sha string) (arbiter.Artifact, bool, error) {
	t, ok := s.taskByID(id)
	if !ok {
		return arbiter.Artifact{}, false, arbiter.Errorf(arbiter.ENotFound, "task %s does not exist", id)
	}
	if err := arbiter.ValidateSHA256("X-Content-SHA256", sha); err != nil {
		return arbiter.Artifact{}, false, err
	}
	limit := s.tasks.MaxArtifactBytes
	if r.ContentLength > limit {
		return arbiter.Artifact{}, false, arbiter.Errorf(arbiter.ETooLarge, "the artifact is %d bytes, more than the limit of %d", r.ContentLength, limit)
	}
	blob, err := s.tasks.Artifacts.Ingest(r.Body, sha, limit)
	if err != nil {
		return arbiter.Artifact{}, false, err
	}
	added, err := arbiter.Do(r.Context(), s.plane, arbiter.AddArtifact{Artifact: arbiter.Artifact{
		ID: blob.ID, SizeBytes: blob.Size, TaskID: t.ID, Worker: worker,
	}, Data: blob.Data}) // Data: the store left the bytes' durability to this commit
	if err != nil {
		return arbiter.Artifact{}, false, httpio.ContextError(r.Context(), err)
	}
	return added.Artifact, blob.Existed || added.Existed, nil
}

func (s *Server) handleUploadArtifact(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	id, err := taskPathID(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "worker"); err != nil {
		return err
	}
	worker := q.Get("worker")
	if err := arbiter.ValidateName("worker", worker); err != nil {
		return err
	}
	a, existed, err := s.ingest(r, id, worker, strings.ToLower(strings.TrimSpace(r.Header.Get("X-Content-SHA256"))))
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if existed {
		status = http.StatusOK
	}
	httpio.WriteJSON(w, status, arbiter.ArtifactAdded{Artifact: a, Existed: existed})
	return nil
}

func (s *Server) handleArtifacts(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := s.taskOff(); err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "task"); err != nil {
		return err
	}
	task := q.Get("task")
	if task != "" {
		if err := arbiter.ValidateSHA256("task", task); err != nil {
			return err
		}
	}
	// A task's artifacts: those uploaded for it, and the one it completed
	// with, which may be the same bytes another task uploaded first (they
	// are stored once, under the first task).
	completedWith := ""
	if t, ok := s.taskByID(task); ok && task != "" {
		completedWith = t.ArtifactID
	}
	recs := s.plane.Records(arbiter.KindArtifact)
	out := make([]arbiter.Artifact, 0, len(recs))
	for _, rec := range recs {
		if a, ok := artifactFromRecord(rec.Value); ok && (task == "" || a.TaskID == task || a.ID == completedWith) {
			out = append(out, a)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	httpio.WriteJSON(w, http.StatusOK, struct {
		Artifacts []arbiter.Artifact `json:"artifacts"`
	}{out})
	return nil
}

func (s *Server) artifactByPath(r *http.Request) (arbiter.Artifact, error) {
	if err := s.taskOff(); err != nil {
		return arbiter.Artifact{}, err
	}
	id := r.PathValue("id")
	if err := arbiter.ValidateSHA256("artifact id", id); err != nil {
		return arbiter.Artifact{}, err
	}
	v, ok := s.plane.Record(arbiter.KindArtifact, id)
	a, ok2 := artifactFromRecord(v)
	if !ok || !ok2 {
		return arbiter.Artifact{}, arbiter.Errorf(arbiter.ENotFound, "artifact %s does not exist: see GET /api/v1/artifacts", id)
	}
	return a, nil
}

func (s *Server) handleArtifact(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	a, err := s.artifactByPath(r)
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, a)
	return nil
}

func (s *Server) handleArtifactContent(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	a, err := s.artifactByPath(r)
	if err != nil {
		return err
	}
	f, _, err := s.tasks.Artifacts.Open(a.ID)
	if err != nil {
		return err
	}
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-SHA256", a.ID)
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s-%s.tar.zst"`, a.TaskName, a.ID[:12]))
	h.Set("Cache-Control", "private, max-age=31536000, immutable")
	// ServeContent would honour Range too; blobs are immutable, so the
	// modification time is their creation.
	http.ServeContent(w, r, "", a.CreatedAt.Truncate(time.Second), f)
	return nil
}
