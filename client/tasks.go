package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The work queue's native API (tasks.go). Errors are as for every Client
// method: the server's own code and message as an *arbiter.Error.

// TaskFilter selects tasks for Tasks; zero fields match all.
type TaskFilter struct {
	Status, Worker, Model string
}

// Tasks lists the tasks passing f, in claim order (priority, then age).
func (c *Client) Tasks(ctx context.Context, f TaskFilter) ([]arbiter.Task, error) {
	q := url.Values{}
	for k, v := range map[string]string{"status": f.Status, "worker": f.Worker, "model": f.Model} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var out struct {
		Tasks []arbiter.Task `json:"tasks"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/tasks", q, nil, &out)
	return out.Tasks, err
}

// Task returns one task. Errors: invalid for an id that is not 64 hex
// digits, not_found.
func (c *Client) Task(ctx context.Context, id string) (arbiter.Task, error) {
	return send[arbiter.Task](ctx, c, http.MethodGet, taskPath(id), nil, nil)
}

// TaskSummary returns counts by status, the manifest in force and the
// latest failures.
func (c *Client) TaskSummary(ctx context.Context) (arbiter.TaskSummary, error) {
	return send[arbiter.TaskSummary](ctx, c, http.MethodGet, "/api/v1/tasks/summary", nil, nil)
}

// ClaimOptions narrow a claim: NoCPU skips tasks that need no GPU, NoGPU
// skips tasks that need GPUs.
type ClaimOptions struct {
	NoCPU, NoGPU bool
}

// ClaimTask claims the best task worker's host may run now; nil when
// nothing fits. Errors: invalid for a bad worker name or capability,
// forbidden without the agent role.
func (c *Client) ClaimTask(ctx context.Context, worker string, cp arbiter.Capability, o ClaimOptions) (*arbiter.Task, error) {
	body := struct {
		Worker     string             `json:"worker"`
		Capability arbiter.Capability `json:"capability"`
		NoCPU      bool               `json:"no_cpu,omitempty"`
		NoGPU      bool               `json:"no_gpu,omitempty"`
	}{worker, cp, o.NoCPU, o.NoGPU}
	var out arbiter.TaskClaim
	err := c.do(ctx, http.MethodPost, "/api/v1/tasks/claim", nil, body, &out)
	return out.Task, err
}

type workerCall struct {
	Worker     string `json:"worker"`
	Claim      int64  `json:"claim,omitempty"` // omitted when 0: a server before claims refuses the field
	ArtifactID string `json:"artifact_id,omitempty"`
	Error      string `json:"error,omitempty"`
	// Omitted when false, as Claim when 0.
	Interrupted bool `json:"interrupted,omitempty"`
}

// HeartbeatTask keeps a claimed task alive; claim is the claim it is about
// (arbiter.Task.Claim; 0 for any). Errors: conflict when it is no longer
// claimed by worker under that claim (stop working on it), not_found.
func (c *Client) HeartbeatTask(ctx context.Context, id, worker string, claim int64) (arbiter.Task, error) {
	return send[arbiter.Task](ctx, c, http.MethodPost, taskPath(id)+"/heartbeat", nil, workerCall{Worker: worker, Claim: claim})
}

// CompleteTask finishes a task with an uploaded artifact. Errors: as
// HeartbeatTask, invalid for an artifact not uploaded.
func (c *Client) CompleteTask(ctx context.Context, id, worker string, claim int64, artifactID string) (arbiter.Task, error) {
	return send[arbiter.Task](ctx, c, http.MethodPost, taskPath(id)+"/complete", nil, workerCall{Worker: worker, Claim: claim, ArtifactID: artifactID})
}

// FailTask reports a failed attempt with its error; interrupted says the
// worker stopped it through no fault of the task (the attempt does not
// count). Errors: as HeartbeatTask.
func (c *Client) FailTask(ctx context.Context, id, worker string, claim int64, msg string, interrupted bool) (arbiter.Task, error) {
	return send[arbiter.Task](ctx, c, http.MethodPost, taskPath(id)+"/fail", nil, workerCall{Worker: worker, Claim: claim, Error: msg, Interrupted: interrupted})
}

// CancelTask cancels a task (admin). Errors: not_found, conflict for a
// final task.
func (c *Client) CancelTask(ctx context.Context, id, reason string) (arbiter.Task, error) {
	var q url.Values
	if reason != "" {
		q = url.Values{"reason": {reason}}
	}
	return send[arbiter.Task](ctx, c, http.MethodPost, taskPath(id)+"/cancel", q, nil)
}

// RequeueTask makes a failed or cancelled task pending again (admin).
// Errors: not_found, conflict in any other status.
func (c *Client) RequeueTask(ctx context.Context, id string) (arbiter.Task, error) {
	return send[arbiter.Task](ctx, c, http.MethodPost, taskPath(id)+"/requeue", nil, nil)
}

// ReloadTasks makes the server read its manifest again (admin). Errors:
// invalid with the manifest's problem (nothing changed).
func (c *Client) ReloadTasks(ctx context.Context) (arbiter.TaskSyncReport, error) {
	return send[arbiter.TaskSyncReport](ctx, c, http.MethodPost, "/api/v1/tasks/reload", nil, nil)
}

// Workers lists the workers with their last-seen time and capability.
func (c *Client) Workers(ctx context.Context) ([]arbiter.Worker, error) {
	var out struct {
		Workers []arbiter.Worker `json:"workers"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/workers", nil, nil, &out)
	return out.Workers, err
}

// Artifacts lists artifact metadata, of one task when taskID is set.
func (c *Client) Artifacts(ctx context.Context, taskID string) ([]arbiter.Artifact, error) {
	var q url.Values
	if taskID != "" {
		q = url.Values{"task": {taskID}}
	}
	var out struct {
		Artifacts []arbiter.Artifact `json:"artifacts"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/artifacts", q, nil, &out)
	return out.Artifacts, err
}

// Artifact returns one artifact's metadata. Errors: invalid, not_found.
func (c *Client) Artifact(ctx context.Context, id string) (arbiter.Artifact, error) {
	return send[arbiter.Artifact](ctx, c, http.MethodGet, "/api/v1/artifacts/"+url.PathEscape(id), nil, nil)
}

// minRate bounds how slowly a transfer may go before it times out:
// a transfer of n bytes gets the client's timeout plus n at this rate.
const minRate = 1 << 20 // bytes per second

// UploadArtifact streams size bytes of r as task id's artifact, announced
// with sha (its sha256, hex). existed is true when the server already had
// those bytes. Errors: invalid for a sha mismatch or a bad id, too_large
// past the server's limit, not_found for an unknown task.
func (c *Client) UploadArtifact(ctx context.Context, id, worker, sha string, r io.Reader, size int64) (a arbiter.Artifact, existed bool, err error) {
	limit := c.timeout + time.Duration(size/minRate)*time.Second
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := c.newRequest(rctx, http.MethodPut, taskPath(id)+"/artifact", url.Values{"worker": {worker}}, io.NopCloser(r))
	if err != nil {
		return a, false, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Content-SHA256", sha)
	resp, err := c.hc.Do(req)
	if err != nil {
		return a, false, c.transportError(ctx, rctx, limit, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return a, false, decodeError(resp)
	}
	var out arbiter.ArtifactAdded
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return a, false, fmt.Errorf("unexpected answer from arbiter at %s to an upload: %w", c.base, err)
	}
	return out.Artifact, resp.StatusCode == http.StatusOK, nil
}

// DownloadArtifact writes artifact id's bytes to w, checking that they hash
// to id, and returns how many it wrote. Errors: not_found, or a mismatch
// (the bytes written are then not the artifact).
func (c *Client) DownloadArtifact(ctx context.Context, id string, w io.Writer) (int64, error) {
	a, err := c.Artifact(ctx, id)
	if err != nil {
		return 0, err
	}
	limit := c.timeout + time.Duration(a.SizeBytes/minRate)*time.Second
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := c.newRequest(rctx, http.MethodGet, "/api/v1/artifacts/"+url.PathEscape(id)+"/content", nil, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, c.transportError(ctx, rctx, limit, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, decodeError(resp)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), resp.Body)
	if err != nil {
		return n, c.transportError(ctx, rctx, limit, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != id {
		return n, fmt.Errorf("downloaded artifact %s hashes to %s after %d bytes: the transfer was corrupted, try again", id, got, n)
	}
	return n, nil
}

func taskPath(id string) string { return "/api/v1/tasks/" + url.PathEscape(id) }

// FleetResult is the answer of the fleet API's operator calls.
type FleetResult struct {
	OK     bool           `json:"ok"`
	Reason string         `json:"reason,omitempty"`
	NJobs  int            `json:"n_jobs,omitempty"`
	Counts map[string]int `json:"counts,omitempty"`
}

// FleetOperator calls one of the fleet API's operator endpoints with
// X-Operator-Token: action is "cancel" or "requeue" (of job id) or "reload"
// (id ignored). OK false with a reason means the job is unknown or in a
// status that does not allow it. Errors: unauthorized for a wrong token,
// invalid (with the manifest's problem) for a reload that failed.
func (c *Client) FleetOperator(ctx context.Context, action, id, opToken string) (FleetResult, error) {
	path := "/v1/job/" + url.PathEscape(id) + "/" + action
	if action == "reload" {
		path = "/v1/manifest/reload"
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := c.newRequest(rctx, http.MethodPost, path, nil, nil)
	if err != nil {
		return FleetResult{}, err
	}
	req.Header.Set("X-Operator-Token", opToken)
	resp, err := c.hc.Do(req)
	if err != nil {
		return FleetResult{}, c.transportError(ctx, rctx, c.timeout, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		code, ok := statusCodes[resp.StatusCode]
		if !ok {
			code = arbiter.EInternal
		}
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return FleetResult{}, &arbiter.Error{Code: code, Message: e.Error}
		}
		return FleetResult{}, &arbiter.Error{Code: code, Message: "server answered " + resp.Status + ": " + clientSnippet(b)}
	}
	var out FleetResult
	if err := json.Unmarshal(b, &out); err != nil {
		return FleetResult{}, fmt.Errorf("unexpected answer from arbiter at %s to %s: %w", c.base, path, err)
	}
	return out, nil
}
