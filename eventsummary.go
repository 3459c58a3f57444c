package arbiter

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// EventSummary says in one line what an event's record is about, the few
// fields a person looks for, joined by " · ": for an allocation its owner,
// what it holds or wants and why it ended or waits; for a lock its holder
// and note; for a swap its service, model and outcome; for a task its
// name, status, worker and error … The CLI's `arbiter events` and the
// dashboard's events panel both show it. An event whose data it cannot
// read gives "".
func EventSummary(ev Event) string {
	var r struct {
		// Fields of the records events carry, by their JSON names.
		ID        json.RawMessage   `json:"id"`
		Name      string            `json:"name"`
		Owner     string            `json:"owner"`
		State     string            `json:"state"`
		Status    string            `json:"status"`
		Reason    json.RawMessage   `json:"reason"`
		WhyQueued *string           `json:"why_queued"`
		Machine   json.RawMessage   `json:"machine"`
		Devices   []DeviceRef       `json:"devices"`
		Boards    []Board           `json:"boards"`
		GPUs      []json.RawMessage `json:"gpus"`
		Draining  bool              `json:"draining"`
		Down      bool              `json:"down"`
		Request   struct {
			GPUs int `json:"gpus"`
		} `json:"request"`
		Holder      string  `json:"holder"`
		Note        *string `json:"note"`
		By          string  `json:"by"`
		Forced      bool    `json:"forced"`
		Service     string  `json:"service"`
		ModelKey    string  `json:"model_key"`
		DryRun      bool    `json:"dry_run"`
		ClaimedBy   string  `json:"claimed_by"`
		LastError   string  `json:"last_error"`
		Attempts    int     `json:"attempts"`
		URL         string  `json:"url"`
		Enabled     *bool   `json:"enabled"`
		Cron        string  `json:"cron"`
		TaskName    string  `json:"task_name"`
		SizeBytes   int64   `json:"size_bytes"`
		Worker      string  `json:"worker"`
		Error       string  `json:"error"`
		Key         string  `json:"key"`
		Repo        string  `json:"repo"`
		LocalPath   string  `json:"local_path"`
		Model       string  `json:"model"`
		RequestedBy string  `json:"requested_by"`
	}
	if json.Unmarshal(ev.Data, &r) != nil {
		return ""
	}
	var parts []string
	add := func(ss ...string) {
		for _, s := range ss {
			if s != "" {
				parts = append(parts, s)
			}
		}
	}
	reason := rawText(r.Reason)
	kind, _, _ := strings.Cut(ev.Kind, ".")
	switch kind {
	case "allocation":
		add(ShortOwner(r.Owner))
		switch {
		case len(r.Devices) > 0:
			add(DevicesText(r.Devices))
		case len(r.Boards) > 0:
			add(rawText(r.Machine), Plural(len(r.Boards), "board"))
		case r.Request.GPUs > 0:
			add(Plural(r.Request.GPUs, "GPU"))
		}
		switch {
		case reason != "":
			add(reason)
		case r.WhyQueued != nil:
			add(*r.WhyQueued)
		}
	case "machine":
		m := Machine{Down: r.Down, Draining: r.Draining}
		state := r.State
		if state == "" {
			state = m.State()
		}
		add(state)
		if len(r.GPUs) > 0 {
			add(Plural(len(r.GPUs), "GPU"))
		}
	case "lock":
		if r.Holder != "" {
			add("held by " + r.Holder)
		}
		if r.Note != nil {
			add(*r.Note)
		}
		if r.Forced {
			add("forced by " + r.By)
		}
	case "swap":
		add(r.Service, r.ModelKey, r.State)
		if r.DryRun {
			add("dry run")
		}
		add(reason)
		if r.RequestedBy != "" {
			add("by " + r.RequestedBy)
		}
	case "task":
		add(r.Name, r.Status)
		if r.ClaimedBy != "" {
			add("on " + r.ClaimedBy)
		}
		if r.Attempts > 0 {
			add("attempt " + strconv.Itoa(r.Attempts))
		}
		add(ClipLine(r.LastError, 120))
	case "worker":
		add(r.Name)
	case "artifact":
		add(r.TaskName, strconv.FormatInt(r.SizeBytes, 10)+" bytes")
		if r.Worker != "" {
			add("from " + r.Worker)
		}
	case "webhook":
		add(r.URL)
		if r.Enabled != nil && !*r.Enabled {
			add("disabled")
		}
	case "schedule":
		add(r.Name, r.Owner, r.Cron)
	case "service":
		add(r.Name, rawText(r.Machine), r.Model, r.Error)
	case "catalog":
		add(r.Service, r.Key, r.Repo, r.LocalPath)
	default:
		add(r.Name, r.Owner, r.State, r.Status, reason, r.Error)
	}
	return strings.Join(parts, " · ")
}

// rawText is a JSON string's text, "" for anything else (null, an object).
func rawText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// DevicesText names held devices by machine, their indices in ranges:
// "gpu1: 0–3, 6"; several machines are separated by "; "; none is "—".
func DevicesText(ds []DeviceRef) string {
	if len(ds) == 0 {
		return "—"
	}
	by := map[string][]int{}
	var machines []string
	for _, d := range ds {
		if _, ok := by[d.Machine]; !ok {
			machines = append(machines, d.Machine)
		}
		by[d.Machine] = append(by[d.Machine], d.Index)
	}
	parts := make([]string, 0, len(machines))
	for _, m := range machines {
		idx := by[m]
		slices.Sort(idx)
		var s []string
		for i := 0; i < len(idx); {
			j := i
			for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
				j++
			}
			switch {
			case j == i:
				s = append(s, strconv.Itoa(idx[i]))
			case j == i+1:
				s = append(s, strconv.Itoa(idx[i]), strconv.Itoa(idx[j]))
			default:
				s = append(s, strconv.Itoa(idx[i])+"–"+strconv.Itoa(idx[j]))
			}
			i = j + 1
		}
		parts = append(parts, m+": "+strings.Join(s, ", "))
	}
	return strings.Join(parts, "; ")
}
