package httpapi

import (
	_ "embed"
	"encoding/json"
)

// srvOpenAPI is the OpenAPI 3.1 description of the native API, written by
// hand next to the routes; a test checks that it names every route.
//
//go:embed openapi.json
var srvOpenAPI []byte

// srvOpenAPIDocument returns the document with info.version set to the
// server's version.
func srvOpenAPIDocument(version string) []byte {
	if version == "" {
		return srvOpenAPI
	}
	var doc map[string]any
	if err := json.Unmarshal(srvOpenAPI, &doc); err != nil {
		return srvOpenAPI // the test keeps it valid; serve it as it is
	}
	if info, ok := doc["info"].(map[string]any); ok {
		info["version"] = version
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return srvOpenAPI
	}
	return b
}
