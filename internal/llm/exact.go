package llm

import (
	"reflect"
	"slices"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/llmq/llmq/client"
	llmqjson "github.com/llmq/llmq/internal/jsontext"
)

// unmarshal decodes a JSON text as a provider reads it: member names match
// exactly, never by case, and a member named twice is an error. Every body
// and answer this package reads goes through it. Invalid UTF-8 is replaced:
// jsontext refused what cannot be stored before.
func unmarshal(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, jsontext.AllowInvalidUTF8(true))
}

// otherMembers holds the members of an object llmq decodes that it does
// not read (a raw type's field tagged `json:",unknown"`).
type otherMembers map[string]jsontext.Value

// object is a raw type of a request's object.
type object interface{ others() otherMembers }

func (b *rawChatBody) others() otherMembers       { return b.Other }
func (b *rawEmbeddingsBody) others() otherMembers { return b.Other }
func (b *rawResponsesBody) others() otherMembers  { return b.Other }
func (m *rawMessage) others() otherMembers        { return m.Other }
func (p *rawPart) others() otherMembers           { return p.Other }
func (it *rawItem) others() otherMembers          { return it.Other }
func (p *rawInputPart) others() otherMembers      { return p.Other }

func decodeBody(body []byte, v object) error {
	if err := unmarshal(body, v); err != nil {
		return invalid("body", "'body' is not valid JSON: %v", err)
	}
	return nil
}

// checkCase notes, as Body.CaseVariant, the first member of the object at
// path that llmq did not read whose name differs from one it reads only in
// case: a provider matching names without case would bill what llmq never
// counted, so admission refuses such a body.
func (r *request) checkCase(v object, path string) {
	other := v.others()
	if len(other) == 0 || r.variant != nil {
		return
	}
	read := readNames(reflect.TypeOf(v).Elem())
	names := make([]string, 0, len(other))
	for name := range other {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if field, ok := read[llmqjson.FoldName(name)]; ok {
			p := name
			if path != "" {
				p = path + "." + name
			}
			r.variant = invalid(p, "'%s' differs from '%s' only in case: member names are case-sensitive, and a provider that matches them without case could read it as '%s'; name it '%s'",
				p, field, field, field)
			r.variant.Code = client.CodeCaseVariant
			return
		}
	}
}

// readNames maps the folded json names of t's fields to the names.
func readNames(t reflect.Type) map[string]string {
	if m, ok := namesByType.Load(t); ok {
		return m.(map[string]string)
	}
	m := map[string]string{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" {
			m[llmqjson.FoldName(name)] = name
		}
	}
	namesByType.Store(t, m)
	return m
}

var namesByType sync.Map // reflect.Type → map[string]string
