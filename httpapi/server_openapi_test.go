package httpapi

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"
)

// doc is the part of the OpenAPI document the tests look at.
type doc struct {
	OpenAPI    string                               `json:"openapi"`
	Info       struct{ Version string }             `json:"info"`
	Paths      map[string]map[string]map[string]any `json:"paths"`
	Components struct {
		SecuritySchemes map[string]any `json:"securitySchemes"`
		Schemas         map[string]any `json:"schemas"`
	} `json:"components"`
}

func TestServerOpenAPICoversRoutes(t *testing.T) {
	var doc doc
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Errorf("got openapi %q, want 3.1.x", doc.OpenAPI)
	}
	if doc.Components.SecuritySchemes["bearer"] == nil || doc.Components.Schemas["Error"] == nil {
		t.Errorf("got no bearer security scheme or Error schema")
	}
	routes := map[string]bool{}
	for _, rt := range apiRoutes {
		op := strings.ToLower(rt.method)
		routes[op+" "+rt.path] = true
		o, ok := doc.Paths[rt.path][op]
		if !ok {
			t.Errorf("route %s is not in openapi.json", rt.pattern())
			continue
		}
		resp, _ := o["responses"].(map[string]any)
		if len(resp) == 0 {
			t.Errorf("route %s has no responses in openapi.json", rt.pattern())
		}
		// Public: an empty security requirement of its own (the fleet's /v1
		// routes list theirs: client certificate, token, operator token).
		sec, has := o["security"].([]any)
		if public := has && len(sec) == 0; public != (rt.roles&publicRoute != 0) {
			t.Errorf("route %s: got public %v in openapi.json, want %v", rt.pattern(), public, rt.roles&publicRoute != 0)
		}
	}
	var extra []string
	for path, ops := range doc.Paths {
		for op := range ops {
			if op != "parameters" && !routes[op+" "+path] {
				extra = append(extra, op+" "+path)
			}
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("openapi.json describes routes the server does not have: %v", extra)
	}
	// Every $ref points at something that exists.
	var all map[string]any
	_ = json.Unmarshal(openAPI, &all)
	checkRefs(t, all, all)
}

func checkRefs(t *testing.T, root, v any) {
	t.Helper()
	switch x := v.(type) {
	case map[string]any:
		if ref, ok := x["$ref"].(string); ok {
			var cur any = root
			for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
				m, _ := cur.(map[string]any)
				cur = m[part]
			}
			if cur == nil {
				t.Errorf("$ref %q points at nothing", ref)
			}
		}
		for _, e := range x {
			checkRefs(t, root, e)
		}
	case []any:
		for _, e := range x {
			checkRefs(t, root, e)
		}
	}
}

func TestServerOpenAPIServed(t *testing.T) {
	s, _ := testServer(t, func(o *Options) { o.Version = "1.2.3" })
	a := call(t, s, "GET", "/api/v1/openapi.json", "", nil)
	var doc doc
	a.decode(t, &doc)
	if a.status != 200 || doc.Info.Version != "1.2.3" || len(doc.Paths) == 0 {
		t.Errorf("got %d version %q with %d paths, want 200 version 1.2.3 with paths", a.status, doc.Info.Version, len(doc.Paths))
	}
}
