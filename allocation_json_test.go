package arbiter

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestAllocationJSON holds AppendJSON to encoding/json's reflection over
// the struct tags, for allocations whose every field — found by
// reflection, so a field added later is covered — is filled at random:
// odd strings, extreme numbers, times in other zones, nil and empty.
func TestAllocationJSON(t *testing.T) {
	holdToReflection(t, 1, (*Allocation).AppendJSON, func(a *Allocation) []byte { return reflectJSON(t, a) })
}

// holdToReflection fills values of T at random (fill) and checks that
// appendJSON, and json.Marshal through T's MarshalJSON, write what want
// (reflection over methodless copies of the structs) does, and that the
// result reads back.
func holdToReflection[T any](t *testing.T, seed uint64, appendJSON func(*T, []byte) []byte, want func(*T) []byte) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i := 0; i < 3000; i++ {
		var v T
		fill(rng, reflect.ValueOf(&v).Elem(), 0)
		got := appendJSON(&v, nil)
		w := want(&v)
		if string(got) != string(w) {
			t.Fatalf("%T %d:\ngot  %s\nwant %s", v, i, got, w)
		}
		if m, _ := json.Marshal(v); string(m) != string(w) {
			t.Fatalf("json.Marshal of %T %d:\ngot  %s\nwant %s", v, i, m, w)
		}
		var back T
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%T %d does not read back: %v\n%s", v, i, err, got)
		}
	}
}

// reflectJSON is a's JSON by reflection: the same struct without methods,
// and the grid request as its form-echoing marshaller defines it.
func reflectJSON(t *testing.T, a *Allocation) []byte {
	t.Helper()
	type plainRequest struct {
		Owner       string          `json:"owner"`
		Label       string          `json:"label,omitempty"`
		GPUs        int             `json:"gpus"`
		MinVRAMGiB  float64         `json:"min_vram_gib,omitempty"`
		RequireCUDA bool            `json:"require_cuda,omitempty"`
		MinCompute  string          `json:"min_compute,omitempty"`
		Model       string          `json:"model,omitempty"`
		Tags        []string        `json:"tags,omitempty"`
		Machine     string          `json:"machine,omitempty"`
		Priority    int             `json:"priority,omitempty"`
		IdleExempt  bool            `json:"idle_exempt,omitempty"`
		Pool        string          `json:"pool,omitempty"`
		Grid        json.RawMessage `json:"grid,omitempty"`
		KeepaliveS  *float64        `json:"keepalive_s"`
		TimeLimitS  *float64        `json:"time_limit_s,omitempty"`
		Preemptible bool            `json:"preemptible,omitempty"`
		Reservation string          `json:"reservation,omitempty"`
	}
	if n := reflect.TypeFor[Request]().NumField(); n != reflect.TypeFor[plainRequest]().NumField() {
		t.Fatalf("Request has %d fields, the test's copy %d: add the new one to both and to AppendJSON", n, reflect.TypeFor[plainRequest]().NumField())
	}
	r := a.Request
	pr := plainRequest{r.Owner, r.Label, r.GPUs, r.MinVRAMGiB, r.RequireCUDA, r.MinCompute, r.Model, r.Tags, r.Machine, r.Priority,
		r.IdleExempt, r.Pool, nil, r.KeepaliveS, r.TimeLimitS, r.Preemptible, r.Reservation}
	if r.Grid != nil {
		type plainGrid GridRequest
		g := plainGrid(*r.Grid)
		g.Args = r.Grid.EchoArgs()
		var err error
		if pr.Grid, err = json.Marshal(g); err != nil {
			t.Fatal(err)
		}
	}
	// Allocation's fields in order, its request as plainRequest.
	at := reflect.TypeFor[Allocation]()
	var fields []reflect.StructField
	for i := 0; i < at.NumField(); i++ {
		f := at.Field(i)
		if f.Name == "Request" {
			f.Type = reflect.TypeFor[plainRequest]()
		}
		fields = append(fields, f)
	}
	p := reflect.New(reflect.StructOf(fields)).Elem()
	av := reflect.ValueOf(a).Elem()
	for i := range fields {
		if fields[i].Name == "Request" {
			p.Field(i).Set(reflect.ValueOf(pr))
		} else {
			p.Field(i).Set(av.Field(i))
		}
	}
	out, err := json.Marshal(p.Interface())
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	return out
}

var oddStrings = []string{"", "a", "bench-0@host", "<script>&amp;</script>", "quote\"back\\slash", "tab\tnew\nline\x01",
	"ünïcödé ✓", "\xff\xfe invalid utf-8", "\u2028\u2029", "GPU-0000-aaaa", "H100 80GB HBM3"}

var oddFloats = []float64{0, 1, -1, 0.5, 80, 1e-7, 1e-6, 123456789.125, 1e20, 1e21, 3.0e-300, -2.5e25, math.MaxFloat64, math.SmallestNonzeroFloat64}

// fill sets every field of v at random, recursively.
func fill(rng *rand.Rand, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(oddStrings[rng.IntN(len(oddStrings))])
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Int, reflect.Int64, reflect.Int32:
		switch rng.IntN(4) {
		case 0:
			v.SetInt(0)
		case 1:
			v.SetInt(-rng.Int64N(1 << 40))
		default:
			v.SetInt(rng.Int64N(1 << 40))
		}
	case reflect.Uint8, reflect.Uint, reflect.Uint64:
		v.SetUint(uint64(rng.IntN(4)))
	case reflect.Float64:
		v.SetFloat(oddFloats[rng.IntN(len(oddFloats))])
	case reflect.Pointer:
		if rng.IntN(3) == 0 || depth > 4 {
			v.SetZero()
			return
		}
		v.Set(reflect.New(v.Type().Elem()))
		fill(rng, v.Elem(), depth+1)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			raws := []string{"", `{}`, `{"machine": "m", "tags": ["a"]}`, `{"a" : [1, 2 , {"b":null}]}`, `{"k":"<a&b>"}`, "{\"k\": \"\u2028\"}"}
			if r := raws[rng.IntN(len(raws))]; r != "" {
				v.SetBytes([]byte(r))
			}
			return
		}
		switch rng.IntN(4) {
		case 0:
			v.SetZero()
			return
		case 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
			return
		}
		n := 1 + rng.IntN(3)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			fill(rng, s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			zones := []*time.Location{time.UTC, time.FixedZone("X", 5*3600+30*60), time.FixedZone("Y", -7*3600)}
			tm := time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)*int64(rng.IntN(2))).In(zones[rng.IntN(len(zones))])
			v.Set(reflect.ValueOf(tm))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(rng, v.Field(i), depth+1)
			}
		}
	}
}

func BenchmarkAllocationJSON(b *testing.B) {
	now := time.Now()
	ka := 60.0
	a := Allocation{ID: 1234, Owner: "bench-0@host", State: StateReady, Machine: Str("gpu1"),
		Devices:   []DeviceRef{{Machine: "gpu1", Index: 3, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80}},
		Request:   Request{Owner: "bench-0@host", GPUs: 1, KeepaliveS: &ka},
		CreatedAt: now, ReadyAt: &now, KeepaliveS: &ka, ExpiresAt: &now}
	b.Run("append", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf = a.AppendJSON(buf[:0])
		}
	})
	b.Run("reflection", func(b *testing.B) {
		type plain Allocation
		for b.Loop() {
			json.Marshal(plain(a))
		}
	})
}
