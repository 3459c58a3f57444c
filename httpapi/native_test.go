package httpapi

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// jsonNames lists the JSON names of t's fields, embedded ones included.
func jsonNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && name == "":
			out = append(out, jsonNames(f.Type)...)
		case name != "-" && name != "" && f.IsExported():
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestServerOpenAPISchemasMatchTypes: the OpenAPI document describes every
// field the native types put on the wire (docs/reference/native.md), by the same
// names, and no other.
func TestServerOpenAPISchemasMatchTypes(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	for name, typ := range map[string]reflect.Type{
		"Allocation":    reflect.TypeFor[arbiter.Allocation](),
		"Request":       reflect.TypeFor[arbiter.Request](),
		"DeviceRef":     reflect.TypeFor[arbiter.DeviceRef](),
		"MachineStatus": reflect.TypeFor[arbiter.MachineStatus](),
		"DeviceStatus":  reflect.TypeFor[arbiter.DeviceStatus](),
		"Event":         reflect.TypeFor[arbiter.Event](),
		"PoolStatus":    reflect.TypeFor[arbiter.PoolStatus](),
	} {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		var got []string
		for p := range s.Properties {
			got = append(got, p)
		}
		sort.Strings(got)
		if want := jsonNames(typ); !reflect.DeepEqual(got, want) {
			t.Errorf("schema %s: got properties %v, want %v (the fields of %v)", name, got, want, typ)
		}
	}
}
