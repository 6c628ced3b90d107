package llm

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The kinds of the providers' built-in tools: run by the provider within one
// response, each call billed beside the tokens.
const (
	ToolWebSearch       = "web_search"
	ToolFileSearch      = "file_search"
	ToolCodeInterpreter = "code_interpreter"
	ToolImageGeneration = "image_generation"
	ToolComputerUse     = "computer_use"
)

// clientTools are the tool types whose calls the client runs: a call ends
// the response, so they bill no more than its tokens.
var clientTools = map[string]bool{"function": true, "custom": true, "local_shell": true, "shell": true, "apply_patch": true}

var datedSuffix = regexp.MustCompile(`_\d{4}_\d{2}_\d{2}$`)

// BuiltinTool is the kind of a Responses API tool type the provider runs
// itself ("web_search" for web_search_preview_2025_03_11, "mcp", a type
// llmq does not know by name), or false for a tool the client runs.
func BuiltinTool(typ string) (kind string, builtin bool) {
	switch {
	case clientTools[typ]:
		return "", false
	case strings.HasPrefix(typ, "web_search"):
		return ToolWebSearch, true
	case strings.HasPrefix(typ, "computer_use"):
		return ToolComputerUse, true
	}
	return datedSuffix.ReplaceAllString(typ, ""), true
}

func builtinTools(raw json.RawMessage) ([]string, error) {
	var specs []struct {
		Type json.RawMessage `json:"type"`
	}
	if raw[0] != '[' || unmarshal(raw, &specs) != nil {
		return nil, invalid("tools", "'tools' must be an array of tool objects")
	}
	var kinds []string
	for i, s := range specs {
		typ, ok := jsonString(s.Type)
		if !ok || typ == "" {
			return nil, invalid(fmt.Sprintf("tools[%d].type", i), "'tools[%d].type' must be a non-empty string", i)
		}
		if kind, ok := BuiltinTool(typ); ok && !slices.Contains(kinds, kind) {
			kinds = append(kinds, kind)
		}
	}
	return kinds, nil
}

// toolCallKind is the kind of built-in tool an output item of type typ is a
// call of ("web_search_call" → web_search), or false for any other item.
func toolCallKind(typ string) (string, bool) {
	name, ok := strings.CutSuffix(typ, "_call")
	switch {
	case !ok || clientTools[name] || name == "function" || name == "custom_tool":
		return "", false
	case name == "computer":
		return ToolComputerUse, true
	}
	return BuiltinTool(name)
}
