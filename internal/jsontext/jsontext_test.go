package jsontext

import (
	"bytes"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
)

// What Unstorable finds, where, and of what kind; what it lets through.
// (store's TestUnstorableAgreesWithPostgres holds it to Postgres itself.)
func TestUnstorable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		doc  string
		off  int // -1: nothing to find
		code client.Code
		raw  bool
	}{
		{`{"a":"café \ud83d\ude00","n":-12.5e3}`, -1, "", false},
		{`{"a":"C:\\u0000"}`, -1, "", false}, // an escaped backslash, then "u0000"
		{`{"a":"x\u0000"}`, 7, client.CodeInvalidEncoding, false},
		{`{"a":"x\ud800y"}`, 7, client.CodeInvalidEncoding, false},
		{`{"a":"\udc00"}`, 6, client.CodeInvalidEncoding, false},
		{`{"a":1e200000}`, 5, client.CodeNumberOutOfRange, false},
		{`{"a":"1e200000"}`, -1, "", false}, // a string, not a number
		{"{\"a\":\"caf\xe9\"}", 9, client.CodeInvalidEncoding, true},
		{"{\"a\":\"x\x00\"}", 7, client.CodeInvalidEncoding, true},
		{"{\"a\":\"\\u0000\xff\"}", 12, client.CodeInvalidEncoding, true}, // the bytes first
	} {
		p := Unstorable([]byte(c.doc))
		switch {
		case c.off < 0 && p != nil:
			t.Errorf("%q: found %+v, want nothing", c.doc, p)
		case c.off >= 0 && (p == nil || p.Offset != c.off || p.Code != c.code || p.Raw != c.raw || p.What == ""):
			t.Errorf("%q: found %+v, want offset %d, code %s, raw %v", c.doc, p, c.off, c.code, c.raw)
		}
	}
}

// PathAt names the value that holds a byte, as an error's param does.
func TestPathAt(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"custom_id":"a","body":{"messages":[{"content":"x"},{"content":"yy"}],"n":1e200000},"k":{"r":"s"}}`)
	for _, c := range []struct {
		at   string // the first occurrence of this text in doc
		want string
	}{
		{`"a"`, "custom_id"},
		{`"yy"`, "body.messages[1].content"},
		{`1e200000`, "body.n"},
		{`"r"`, "k"}, // a member's name: its object
		{`"s"`, "k.r"},
	} {
		off := bytes.Index(doc, []byte(c.at))
		if got := PathAt(doc, off); got != c.want {
			t.Errorf("PathAt(%s) = %q, want %q", c.at, got, c.want)
		}
		if f := Field(PathAt(doc, off)); f == "" || f != Field(c.want) {
			t.Errorf("Field of %q = %q", c.want, f)
		}
	}
	if got := PathAt([]byte(`{"a":`), 3); got != "" {
		t.Errorf("a document that does not parse: %q", got)
	}
}

// A member named twice, at any depth, and nesting past MaxDepth are found,
// with the path of the object that holds them.
func TestStructure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		doc  string
		code client.Code
		path string
	}{
		{`{"model":"o3","model":"cap-raw","max_tokens":5}`, client.CodeDuplicateKey, ""},
		{`{"body":{"messages":[{"role":"user","content":"a","content":"b"}]}}`, client.CodeDuplicateKey, "body.messages[0]"},
		{`{"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":2}]}`, "", ""},
		{`{"a":"\"a\"","b":1}`, "", ""},
		{strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), "", ""},
		{`{"body":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, client.CodeTooDeep, "body[0]"},
		{`{"body":{"metadata":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}}`, client.CodeTooDeep, "body.metadata"},
		{`not json {"a":1,"a":2}`, "", ""},
	} {
		p := Structure([]byte(c.doc))
		switch {
		case c.code == "" && p != nil:
			t.Errorf("%.60s: %+v, want none", c.doc, p)
		case c.code != "" && (p == nil || p.Code != c.code):
			t.Errorf("%.60s: %+v, want %s", c.doc, p, c.code)
		case c.code != "" && PathAt([]byte(c.doc), p.Offset) != c.path:
			t.Errorf("%.60s: %s at %q, want %q", c.doc, p.Code, PathAt([]byte(c.doc), p.Offset), c.path)
		}
	}
	if p := Structure([]byte(`{"model":"o3","model":"x"}`)); p == nil || p.What != `the member "model" a second time` {
		t.Errorf("what: %+v", p)
	}
}

// Names that differ only in case, at any depth, are refused as a name
// given twice: a reader matching names without case (Go's, and the
// Kelvin sign for k, ſ for s) could take either. Names that differ
// otherwise are not.
func TestStructureCaseVariants(t *testing.T) {
	for _, c := range []struct {
		doc, path string
	}{
		{`{"max_tokens":2000,"MAX_TOKENS":16}`, ""},
		{`{"Model":"a","model":"b"}`, ""},
		{`{"messages":[{"role":"user","content":"a","Content":"b"}]}`, "messages[0]"},
		{`{"a":{"b":[{"c":{"max_toKens":1,"max_tokens":2}}]}}`, "a.b[0].c"},
		{"{\"ma\u017fx\":1,\"maSx\":2}", ""},
		{"{\"\u212a\":1,\"k\":2}", ""},
	} {
		p := Structure([]byte(c.doc))
		if p == nil || p.Code != client.CodeDuplicateKey {
			t.Errorf("%s: got %+v, want %s", c.doc, p, client.CodeDuplicateKey)
			continue
		}
		if got := PathAt([]byte(c.doc), p.Offset); got != c.path {
			t.Errorf("%s: at %q, want %q", c.doc, got, c.path)
		}
		if !strings.Contains(p.What, "only in case") {
			t.Errorf("%s: %q does not say the names differ only in case", c.doc, p.What)
		}
	}
	for _, doc := range []string{
		`{"max_tokens":1,"max_token":2,"MAX":3}`,
		`{"a":{"x":1},"b":{"X":1}}`,
		`[{"k":1},{"K":2}]`,
		"{\"\u00e9\":1,\"e\":2}",
	} {
		if p := Structure([]byte(doc)); p != nil {
			t.Errorf("%s: refused: %+v", doc, p)
		}
	}
}

// With the names a reader takes, a top-level member named as one of them
// but for case is refused: Go's decoder would take it for that member.
// Deeper members and exact names are the caller's.
func TestStructureEnvelopeNames(t *testing.T) {
	type envelope struct {
		CustomID string `json:"custom_id"`
		Body     any    `json:"body"`
		Skip     string `json:"-"`
	}
	names := Names(&envelope{})
	if strings.Join(names, ",") != "custom_id,body" {
		t.Fatalf("names %v", names)
	}
	p := Structure([]byte(`{"custom_id":"a","BODY":{"x":1}}`), names...)
	if p == nil || p.Code != client.CodeCaseVariant || p.Param([]byte(`{"custom_id":"a","BODY":{"x":1}}`)) != "BODY" {
		t.Fatalf("got %+v", p)
	}
	for _, doc := range []string{`{"custom_id":"a","body":{"BODY":1}}`, `{"custom_id":"a","other":1}`} {
		if p := Structure([]byte(doc), names...); p != nil {
			t.Fatalf("%s: %+v", doc, p)
		}
	}
}
