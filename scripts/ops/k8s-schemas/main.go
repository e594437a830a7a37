// Command k8s-schemas writes kubeconform-compatible JSON schemas ("standalone", i.e. every
// $ref inlined, and "strict", i.e. additionalProperties: false) for the Kubernetes kinds of
// the API groups compiled into the ./openapi package.
//
// The ./openapi package is not checked in: scripts/ops/gen-k8s-schemas.sh generates it with
// k8s.io/kube-openapi's openapi-gen from the Go types of a pinned k8s.io/api release — the
// same definitions kube-apiserver builds its OpenAPI document from — so kubeconform can
// validate rendered manifests without downloading schemas from the internet.
//
// Output layout matches kubeconform's default -schema-location template:
//
//	<out>/<kind>[-<group prefix>]-<version>.json   e.g. statefulset-apps-v1.json, service-v1.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"loopwatch.local/k8sschemas/openapi"
)

// apiGroups maps each package of k8s.io/api (e.g. "k8s.io/api/apps/v1") to its API group
// ("apps"; "" for core), read from the `const GroupName = "..."` of its register.go.
func apiGroups(apiDir string) map[string]string {
	groups := map[string]string{}
	re := regexp.MustCompile(`(?m)^const GroupName = "([^"]*)"`)
	err := filepath.WalkDir(apiDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "register.go" {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if m := re.FindSubmatch(src); m != nil {
			rel, _ := filepath.Rel(apiDir, filepath.Dir(path))
			groups["k8s.io/api/"+filepath.ToSlash(rel)] = string(m[1])
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	return groups
}

const refPrefix = "#/definitions/"

type converter struct {
	defs  map[string]map[string]any
	stack map[string]bool
}

func toMap(s spec.Schema) map[string]any {
	b, err := json.Marshal(s)
	if err != nil {
		log.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		log.Fatal(err)
	}
	return m
}

// expand returns a copy of node with every $ref inlined, descriptions and defaults dropped,
// int-or-string / quantity formats turned into oneOf, and objects closed (strict).
func (c *converter) expand(node any) any {
	switch n := node.(type) {
	case []any:
		out := make([]any, len(n))
		for i, v := range n {
			out[i] = c.expand(v)
		}
		return out
	case map[string]any:
		if ref, ok := n["$ref"].(string); ok {
			name := strings.TrimPrefix(ref, refPrefix)
			def, found := c.defs[name]
			if !found {
				log.Fatalf("unresolved $ref %q", ref)
			}
			if c.stack[name] {
				// Recursive type: accept anything below this point.
				return map[string]any{"x-recursive-ref": name}
			}
			c.stack[name] = true
			out := c.expand(def)
			delete(c.stack, name)
			return out
		}
		// A lone allOf:[{$ref}] (how v3 definitions attach defaults to refs) is the ref itself.
		if all, ok := n["allOf"].([]any); ok && len(all) == 1 && n["properties"] == nil {
			inner := c.expand(all[0]).(map[string]any)
			for k, v := range n {
				if k != "allOf" && k != "default" && k != "description" {
					inner[k] = c.expand(v)
				}
			}
			return inner
		}
		out := map[string]any{}
		for k, v := range n {
			switch k {
			case "description", "default", "example", "x-kubernetes-v2", "x-kubernetes-v2-schema":
				continue
			case "properties", "patternProperties", "definitions":
				props := map[string]any{}
				for pk, pv := range v.(map[string]any) {
					props[pk] = nullable(c.expand(pv))
				}
				out[k] = props
			default:
				out[k] = c.expand(v)
			}
		}
		switch out["format"] {
		case "int-or-string":
			delete(out, "type")
			delete(out, "format")
			out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		case "quantity":
			delete(out, "type")
			delete(out, "format")
			out["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}
		}
		if _, hasProps := out["properties"]; hasProps {
			if _, set := out["additionalProperties"]; !set && out["x-kubernetes-preserve-unknown-fields"] != true {
				out["additionalProperties"] = false
			}
		}
		return out
	default:
		return n
	}
}

// nullable lets a field be null, as the API server treats null like an absent field.
func nullable(node any) any {
	m, ok := node.(map[string]any)
	if !ok {
		return node
	}
	switch t := m["type"].(type) {
	case string:
		m["type"] = []any{t, "null"}
	case []any:
		has := false
		for _, x := range t {
			has = has || x == "null"
		}
		if !has {
			m["type"] = append(t, "null")
		}
	default:
		if one, ok := m["oneOf"].([]any); ok {
			m["oneOf"] = append(one, map[string]any{"type": "null"})
		}
	}
	return m
}

func main() {
	outDir := flag.String("out", "", "directory to write <kind>-<group>-<version>.json schemas into")
	apiDir := flag.String("api-dir", "", "source directory of the k8s.io/api module (go list -m -f {{.Dir}} k8s.io/api)")
	flag.Parse()
	if *outDir == "" || *apiDir == "" {
		log.Fatal("-out and -api-dir are required")
	}
	groups := apiGroups(*apiDir)
	refFn := func(name string) spec.Ref { return spec.MustCreateRef(refPrefix + name) }
	openAPIDefs := openapi.GetOpenAPIDefinitions(common.ReferenceCallback(refFn))

	c := &converter{defs: map[string]map[string]any{}, stack: map[string]bool{}}
	for name, d := range openAPIDefs {
		c.defs[name] = toMap(d.Schema)
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		log.Fatal(err)
	}
	names := make([]string, 0, len(c.defs))
	for name := range c.defs {
		names = append(names, name)
	}
	sort.Strings(names)
	written := 0
	for _, name := range names {
		dot := strings.LastIndex(name, ".")
		pkg, kind := name[:dot], name[dot+1:]
		if strings.HasPrefix(pkg, "io.k8s.api.") { // model names, e.g. io.k8s.api.apps.v1.StatefulSet
			pkg = "k8s.io/api/" + strings.ReplaceAll(strings.TrimPrefix(pkg, "io.k8s.api."), ".", "/")
		}
		group, known := groups[pkg]
		if !known {
			continue
		}
		props, _ := c.defs[name]["properties"].(map[string]any)
		if props["apiVersion"] == nil || props["kind"] == nil || props["metadata"] == nil {
			continue // not a top-level kind
		}
		version := pkg[strings.LastIndex(pkg, "/")+1:]
		apiVersion, suffix := version, "-"+version
		if group != "" {
			apiVersion = group + "/" + version
			suffix = "-" + strings.ToLower(strings.Split(group, ".")[0]) + "-" + version
		}
		schema := c.expand(c.defs[name]).(map[string]any)
		p := schema["properties"].(map[string]any)
		p["apiVersion"] = map[string]any{"type": []any{"string", "null"}, "enum": []any{apiVersion}}
		p["kind"] = map[string]any{"type": []any{"string", "null"}, "enum": []any{kind}}
		schema["x-kubernetes-group-version-kind"] = []any{
			map[string]any{"group": group, "kind": kind, "version": version},
		}
		schema["$schema"] = "http://json-schema.org/schema#"
		b, err := json.MarshalIndent(schema, "", "  ")
		if err != nil {
			log.Fatal(err)
		}
		file := filepath.Join(*outDir, strings.ToLower(kind)+suffix+".json")
		if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
		written++
	}
	fmt.Printf("wrote %d schemas to %s\n", written, *outDir)
}
