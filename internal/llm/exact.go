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
// a field's name exactly, never by case (encoding/json would take
// "MAX_TOKENS" for max_tokens, so llmq would count one limit and the
// provider, reading names as written, another), and a member named twice
// is an error, not its last value. Every body and answer this package
// reads goes through it. Invalid UTF-8 is taken as encoding/json takes it
// (replaced): what cannot be stored was refused before (jsontext).
func unmarshal(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, jsontext.AllowInvalidUTF8(true))
}

// otherMembers holds the members of an object llmq decodes that it does
// not read (a raw type's field tagged `json:",unknown"`).
type otherMembers map[string]jsontext.Value

// object is a raw type of a request's object: the fields llmq reads, and
// the others.
type object interface{ others() otherMembers }

func (b *rawChatBody) others() otherMembers       { return b.Other }
func (b *rawEmbeddingsBody) others() otherMembers { return b.Other }
func (b *rawResponsesBody) others() otherMembers  { return b.Other }
func (m *rawMessage) others() otherMembers        { return m.Other }
func (p *rawPart) others() otherMembers           { return p.Other }
func (it *rawItem) others() otherMembers          { return it.Other }
func (p *rawInputPart) others() otherMembers      { return p.Other }

// decodeBody decodes a request body into v, refusing a body that is not a
// JSON object.
func decodeBody(body []byte, v object) error {
	if err := unmarshal(body, v); err != nil {
		return invalid("body", "'body' is not valid JSON: %v", err)
	}
	return nil
}

// checkCase notes, as the request's case variant (Body.CaseVariant), the
// first member of the object at path that llmq did not read (v.others())
// whose name differs from the name of one it reads only in case: a
// provider that matches names without case (as Go's encoding/json and
// ASP.NET's web defaults do) could read "MAX_TOKENS" as max_tokens or
// "Content" as content, and bill what llmq never counted; one that
// matches them exactly would ignore what llmq counted. Either way llmq's
// count and the provider's would part, so admission refuses such a body;
// a provider reading names exactly (the simulator) reads it as it is.
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

// readNames maps the folded json names of struct type t's fields to the
// names themselves, once per type.
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
