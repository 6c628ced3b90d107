package llm

import (
	"maps"
	"reflect"
	"slices"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/llmq/llmq/client"
	llmqjson "github.com/llmq/llmq/internal/jsontext"
	"github.com/llmq/llmq/internal/wire"
)

// unmarshal decodes a JSON text as a provider reads it: member names match
// exactly, and a member named twice is an error. Invalid UTF-8 is replaced:
// jsontext refused what cannot be stored before.
func unmarshal(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, jsontext.AllowInvalidUTF8(true))
}

// otherMembers holds the members of an object llmq decodes that it does
// not read (a raw type's field tagged `json:",unknown"`).
type otherMembers map[string]jsontext.Value

// checkCase notes, as Body.CaseVariant, the first member of the object v at
// path that llmq did not read whose name differs from one it reads only in
// case: a provider matching names without case would bill what llmq never
// counted.
func (r *request) checkCase(v any, other otherMembers, path string) {
	if len(other) == 0 || r.variant != nil {
		return
	}
	read := readNames(v)
	for _, name := range slices.Sorted(maps.Keys(other)) {
		if field, ok := read[llmqjson.FoldName(name)]; ok {
			p := name
			if path != "" {
				p = path + "." + name
			}
			r.variant = wire.Invalid(p, client.CodeCaseVariant, "'%s' differs from '%s' only in case: "+
				"member names are case-sensitive, and a provider that matches them without case "+
				"could read it as '%s'; name it '%s'", p, field, field, field)
			return
		}
	}
}

func readNames(v any) map[string]string {
	t := reflect.TypeOf(v)
	if m, ok := namesByType.Load(t); ok {
		return m.(map[string]string)
	}
	m := map[string]string{}
	for _, name := range llmqjson.Names(v) {
		m[llmqjson.FoldName(name)] = name
	}
	namesByType.Store(t, m)
	return m
}

var namesByType sync.Map // reflect.Type → map[string]string
