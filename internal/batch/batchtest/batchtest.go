// Package batchtest builds batch input files for the batch tests and the
// batch benchmarks: a valid chat line, the kinds of lines validation
// refuses (each with its refusal's code), and a file mixing both.
package batchtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/llmq/llmq/client"
)

// ChatLine is an input line asking gpt-4o-mini, its user field set to the
// custom id so the simulator's echo tells which answer is whose.
func ChatLine(customID string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hi"}],"max_tokens":20,"user":%q}}`,
		customID, customID)
}

// BadLine is a kind of invalid input line, and the code its refusal has.
type BadLine struct {
	Code client.Code
	Line func(i int) string
}

// BadLines are the kinds of lines validation refuses one by one. The
// duplicate repeats the custom_id req-0.
var BadLines = []BadLine{
	{client.CodeInvalidJSONLine, func(i int) string { return fmt.Sprintf(`{"custom_id":"bad-%d","method":"POST",`, i) }},
	{client.CodeDuplicateCustomID, func(int) string { return ChatLine("req-0") }},
	{client.CodeInvalidMethod, func(i int) string { return strings.Replace(ChatLine(fmt.Sprintf("bad-%d", i)), `"POST"`, `"GET"`, 1) }},
	{client.CodeInvalidURL, func(i int) string {
		return strings.Replace(ChatLine(fmt.Sprintf("bad-%d", i)), `"url":"/v1/chat/completions"`, `"url":"/v1/embeddings"`, 1)
	}},
	{client.CodeModelNotFound, func(i int) string {
		return strings.Replace(ChatLine(fmt.Sprintf("bad-%d", i)), "gpt-4o-mini", "gpt-9", 1)
	}},
	{client.CodeTokensExceedCapacity, func(i int) string {
		return strings.Replace(ChatLine(fmt.Sprintf("bad-%d", i)), `"max_tokens":20`, `"max_tokens":2000000000`, 1)
	}},
	{client.CodeMissingCustomID, func(int) string { return strings.Replace(ChatLine("x"), `"custom_id":"x",`, "", 1) }},
	{client.CodeMissingBody, func(i int) string {
		return fmt.Sprintf(`{"custom_id":"bad-%d","method":"POST","url":"/v1/chat/completions"}`, i)
	}},
	{client.CodeInvalidRequest, func(i int) string {
		return fmt.Sprintf(`{"custom_id":"bad-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[]}}`, i)
	}},
	{client.CodeUnknownField, func(i int) string {
		return strings.Replace(ChatLine(fmt.Sprintf("bad-%d", i)), `{"custom_id"`, `{"extra":1,"custom_id"`, 1)
	}},
}

// MixedInput is n lines, the last perHundred of every 100 invalid (never
// the first line: req-0 must be valid, a later line repeats its custom_id),
// the kinds of BadLines in turn, the others ChatLine("req-<i>"). It returns
// the file, the valid lines' custom_ids in order, and the refused lines'
// numbers (from 1) and codes in order.
func MixedInput(n, perHundred int) (content []byte, valid []string, refusedLines []int, refusedCodes []client.Code) {
	var b bytes.Buffer
	for i := range n {
		if i > 0 && i%100 >= 100-perHundred {
			k := BadLines[len(refusedLines)%len(BadLines)]
			refusedLines, refusedCodes = append(refusedLines, i+1), append(refusedCodes, k.Code)
			b.WriteString(k.Line(i) + "\n")
			continue
		}
		id := fmt.Sprintf("req-%d", i)
		valid = append(valid, id)
		b.WriteString(ChatLine(id) + "\n")
	}
	return b.Bytes(), valid, refusedLines, refusedCodes
}

// AnswerOf is the text of a chat completion body ("" when it is none).
func AnswerOf(body json.RawMessage) string {
	var c struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) == 0 {
		return ""
	}
	return c.Choices[0].Message.Content
}
