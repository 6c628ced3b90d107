package config

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// PolicyError is an invalid policy: the field, where it is in the file, and
// why. Its message is one line.
type PolicyError struct {
	File   string // empty when not read from a file
	Field  string // e.g. "models[2].limits.tpm"; empty for the whole file
	Line   int    // 1-based; 0 when unknown
	Column int    // 1-based; 0 when unknown
	Msg    string
}

func (e *PolicyError) Error() string {
	msg := "policy: " + e.Msg
	if e.Field != "" {
		msg = "policy: " + e.Field + ": " + e.Msg
	}
	switch {
	case e.File != "" && e.Line > 0:
		return fmt.Sprintf("%s (%s:%d:%d)", msg, e.File, e.Line, e.Column)
	case e.File != "":
		return fmt.Sprintf("%s (%s)", msg, e.File)
	case e.Line > 0:
		return fmt.Sprintf("%s (line %d:%d)", msg, e.Line, e.Column)
	}
	return msg
}

type position struct{ line, col int }

// source is a parsed policy document with an index from field paths to
// positions and back, so that the YAML library's errors and validation
// errors both name the field and its line.
type source struct {
	body   ast.Node
	byPath map[string]position
	byPos  map[position]string
	err    error // the first validation error (fail)
}

// parseSource parses data as exactly one YAML document and decodes it into
// v: its keys checked against the shape of v, then strictly.
func parseSource(data []byte, v any) (*source, error) {
	// checkKeys refuses duplicate keys, naming the field path.
	file, err := parser.ParseBytes(data, 0, parser.AllowDuplicateMapKey())
	if err != nil {
		return nil, yamlError(err, nil)
	}
	var docs []ast.Node
	for _, d := range file.Docs {
		if d != nil && d.Body != nil {
			docs = append(docs, d.Body)
		}
	}
	if len(docs) == 0 {
		return nil, &PolicyError{Msg: "the file is empty; it must list providers, models and tiers"}
	}
	if len(docs) > 1 {
		return nil, &PolicyError{Msg: fmt.Sprintf("must be one YAML document, found %d", len(docs))}
	}
	s := &source{body: docs[0], byPath: map[string]position{}, byPos: map[position]string{}}
	s.walk(s.body, "")
	if err := s.checkKeys(s.body, reflect.TypeOf(v), ""); err != nil {
		return nil, err
	}
	// Strict decoding also covers merge keys, which checkKeys cannot follow.
	if err := yaml.NodeToValue(s.body, v, yaml.Strict()); err != nil {
		return nil, yamlError(err, s)
	}
	return s, nil
}

func unwrap(n ast.Node) ast.Node {
	for {
		switch t := n.(type) {
		case *ast.AnchorNode:
			n = t.Value
		case *ast.TagNode:
			n = t.Value
		default:
			return n
		}
	}
}

func posOf(n ast.Node) (position, bool) {
	if n == nil {
		return position{}, false
	}
	tk := n.GetToken()
	if tk == nil || tk.Position == nil {
		return position{}, false
	}
	return position{tk.Position.Line, tk.Position.Column}, true
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// pairs returns the key/value pairs of a mapping node.
func pairs(n ast.Node) ([]*ast.MappingValueNode, bool) {
	switch t := n.(type) {
	case *ast.MappingNode:
		return t.Values, true
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{t}, true
	}
	return nil, false
}

func keyString(k ast.MapKeyNode) string {
	if tk := k.GetToken(); tk != nil {
		return tk.Value
	}
	return k.String()
}

func (s *source) walk(n ast.Node, path string) {
	n = unwrap(n)
	if p, ok := posOf(n); ok {
		if _, seen := s.byPath[path]; !seen {
			s.byPath[path] = p
		}
		if _, seen := s.byPos[p]; !seen {
			s.byPos[p] = path
		}
	}
	if ps, ok := pairs(n); ok {
		for _, mv := range ps {
			child := path // a merge key's fields belong to the mapping it is in
			if !mv.Key.IsMergeKey() {
				child = joinPath(path, keyString(mv.Key))
			}
			if p, ok := posOf(mv.Key); ok {
				s.byPos[p] = child // an error on a key (unknown, duplicate) is about that field
				if _, seen := s.byPath[child]; !seen {
					s.byPath[child] = p
				}
			}
			if p, ok := posOf(unwrap(mv.Value)); ok {
				s.byPath[child] = p // the value, what a validation error is about
			}
			s.walk(mv.Value, child)
		}
		return
	}
	if seq, ok := n.(*ast.SequenceNode); ok {
		for i, v := range seq.Values {
			s.walk(v, fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

// errorAt builds a validation error for path, pointing at the field's value
// or, when absent, at the nearest enclosing one.
func (s *source) errorAt(path, format string, args ...any) *PolicyError {
	e := &PolicyError{Field: path, Msg: fmt.Sprintf(format, args...)}
	for p := path; ; {
		if pos, ok := s.byPath[p]; ok {
			e.Line, e.Column = pos.line, pos.col
			return e
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			return e
		}
		p = p[:i]
	}
}

// fail records a validation error at path unless one is recorded already:
// building goes on past it, and the policy is refused with the first.
func (s *source) fail(path, format string, args ...any) {
	if s.err == nil {
		s.err = s.errorAt(path, format, args...)
	}
}

// checkKeys refuses mapping keys that are not fields of t, recursively, with
// the path of the key and the nearest valid name.
func (s *source) checkKeys(n ast.Node, t reflect.Type, path string) error {
	n = unwrap(n)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		ps, _ := pairs(n) // not a mapping: decoding reports the type
		seen := map[string]position{}
		for _, mv := range ps {
			if mv.Key.IsMergeKey() {
				continue
			}
			key := keyString(mv.Key)
			child, elem := joinPath(path, key), t
			if t.Kind() == reflect.Map {
				elem = t.Elem() // a map's keys are checked by the caller
			} else {
				kp, _ := posOf(mv.Key)
				fail := func(format string, args ...any) error {
					return &PolicyError{Field: child, Msg: fmt.Sprintf(format, args...), Line: kp.line, Column: kp.col}
				}
				names := make([]string, t.NumField()) // of t's fields in the policy
				for i := range names {
					names[i], _, _ = strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
				}
				i := slices.Index(names, key)
				if i < 0 {
					return fail("unknown field%s", suggest(key, names, "fields"))
				}
				if prev, dup := seen[key]; dup {
					return fail("given twice (also at line %d:%d)", prev.line, prev.col)
				}
				seen[key], elem = kp, t.Field(i).Type
			}
			if err := s.checkKeys(mv.Value, elem, child); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if seq, ok := n.(*ast.SequenceNode); ok {
			for i, v := range seq.Values {
				if err := s.checkKeys(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	case reflect.Int, reflect.Int64:
		// The decoder would truncate 1.5 to 1; a limit is never fractional.
		switch n.(type) {
		case *ast.IntegerNode, *ast.NullNode, *ast.AliasNode, nil:
		default:
			v := n.GetToken().Value
			if strings.Trim(strings.TrimPrefix(v, "-"), "0123456789") == "" && v != "" {
				return s.errorAt(path, "%s is too large", v)
			}
			return s.errorAt(path, "must be a whole number, got %q", v)
		}
	}
	return nil
}

// suggest names the known name (of noun) closest to key, or else lists them
// all.
func suggest(key string, known []string, noun string) string {
	best, bestDist := "", 3 // more than two edits away is not a typo
	for _, k := range known {
		if d := editDistance(key, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best == "" {
		return " (known " + noun + ": " + strings.Join(known, ", ") + ")"
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// yamlError turns an error of the YAML library, several lines speaking of Go
// types, into one line naming the field.
func yamlError(err error, s *source) error {
	var ye yaml.Error
	if !errors.As(err, &ye) {
		msg, _, _ := strings.Cut(err.Error(), "\n")
		return &PolicyError{Msg: msg}
	}
	e := &PolicyError{Msg: ye.GetMessage()}
	tk := ye.GetToken()
	if tk != nil && tk.Position != nil {
		e.Line, e.Column = tk.Position.Line, tk.Position.Column
		if s != nil {
			e.Field = s.byPos[position{e.Line, e.Column}]
		}
	}
	var te *yaml.TypeError
	var oe *yaml.OverflowError
	var ue *yaml.UnexpectedNodeTypeError
	switch {
	case errors.As(err, &ue):
		e.Msg = fmt.Sprintf("must be %s, got %s", nodeTypeName(ue.Expected), nodeTypeName(ue.Actual))
	case errors.As(err, &te):
		got := ""
		if tk != nil {
			got = fmt.Sprintf(", got %q", tk.Value)
		}
		e.Msg = "must be " + describeType(te.DstType) + got
	case errors.As(err, &oe):
		e.Msg = fmt.Sprintf("%s is too large", oe.SrcNum)
	}
	e.Msg, _, _ = strings.Cut(e.Msg, "\n")
	return e
}

// kindNames and nodeTypeNames say what a value of the policy must be, or
// is, in its terms: whole numbers are its only ints.
var kindNames = map[reflect.Kind]string{
	reflect.Int: "a whole number", reflect.Int64: "a whole number",
	reflect.Float64: "a number",
	reflect.Bool:    "true or false",
	reflect.String:  "a string",
	reflect.Slice:   "a list",
	reflect.Struct:  "a mapping", reflect.Map: "a mapping",
}

var nodeTypeNames = map[ast.NodeType]string{
	ast.SequenceType: "a list",
	ast.MappingType:  "a mapping", ast.MappingValueType: "a mapping",
	ast.IntegerType: "a number", ast.FloatType: "a number", ast.InfinityType: "a number", ast.NanType: "a number",
	ast.StringType: "a string", ast.LiteralType: "a string",
	ast.BoolType: "true or false",
	ast.NullType: "empty",
}

func describeType(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return cmp.Or(kindNames[t.Kind()], "a "+t.String())
}

func nodeTypeName(t ast.NodeType) string { return cmp.Or(nodeTypeNames[t], t.YAMLName()) }
