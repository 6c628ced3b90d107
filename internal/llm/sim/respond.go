package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// The text of simulated completions: common words that are one token each in
// o200k_base and cl100k_base, so a completion of k words is about k tokens.
var words = strings.Fields(`the of and to in a is that for it as was with be by on not he this are or his from at which but have an had they you were their one all we can her has there been if more when will would who so no out up into do time only new some could these two may first then its over such than other also after most made well many them our where any work should like see very way well just each much good long make day year data model system request limit token queue worker plan text result answer value order state light world house water place point group number part line`)

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// echo returns the request's "user" field when Config.Echo is set.
func (s *Server) echo(body []byte) string {
	if !s.cfg.Echo {
		return ""
	}
	var r struct {
		User string `json:"user"`
	}
	_ = json.Unmarshal(body, &r)
	return r.User
}

// chatResponse is the chat completion answering c as request n at now with
// the completions of each choice and bill's usage and service tier.
func (s *Server) chatResponse(c *call, n uint64, now time.Time, bill *Bill, completions []int64) []byte {
	b := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(b)
	b.Reset()
	echo := s.echo(c.body)
	b.WriteString(`{"id":`)
	if s.cfg.RandomIDs {
		appendJSONString(b, s.ident("chatcmpl-", identChat, n))
	} else {
		b.WriteString(`"chatcmpl-sim`)
		b.WriteString(strconv.FormatUint(n, 10))
		b.WriteByte('"')
	}
	b.WriteString(`,"object":"chat.completion","created":`)
	b.WriteString(itoa(now.Unix()))
	b.WriteString(`,"model":`)
	appendJSONString(b, c.p.Model)
	b.WriteString(`,"choices":[`)
	for i, k := range completions {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"index":`)
		b.WriteString(strconv.Itoa(i))
		b.WriteString(`,"message":{"role":"assistant","content":`)
		if echo != "" {
			t := strings.NewReplacer(`"`, "", `\`, "").Replace(echo) + " "
			b.WriteString(`"` + t)
		} else {
			b.WriteByte('"')
		}
		s.writeText(b, n, uint64(i), k)
		b.WriteString(`","refusal":null},"logprobs":null,"finish_reason":"`)
		if k >= c.maxTokens {
			b.WriteString("length")
		} else {
			b.WriteString("stop")
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`]`)
	if !s.omitsUsage(n) {
		b.WriteString(`,"usage":{"prompt_tokens":`)
		b.WriteString(itoa(bill.InputTokens))
		b.WriteString(`,"completion_tokens":`)
		b.WriteString(itoa(bill.OutputTokens))
		b.WriteString(`,"total_tokens":`)
		b.WriteString(itoa(bill.InputTokens + bill.OutputTokens))
		b.WriteString(`,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`)
	}
	b.WriteString(`,"service_tier":`)
	appendJSONString(b, bill.ServiceTier)
	b.WriteString(`,"system_fingerprint":"fp_llmqsim"}`)
	b.WriteByte('\n')
	return bytes.Clone(b.Bytes())
}

// omitsUsage reports whether request n's answer leaves its usage out
// (Faults.OmitUsage), drawn from the seed.
func (s *Server) omitsUsage(n uint64) bool {
	s.mu.Lock()
	share := s.faults.OmitUsage
	s.mu.Unlock()
	return share > 0 && s.draw(n, drawNoise+2) < share
}

// streamFails reports whether request n's stream fails after its first
// part (Faults.StreamError), drawn from the seed.
func (s *Server) streamFails(n uint64) bool {
	s.mu.Lock()
	share := s.faults.StreamError
	s.mu.Unlock()
	return share > 0 && s.draw(n, drawNoise+3) < share
}

// writeText writes about k tokens of sentence-like text.
func (s *Server) writeText(b *bytes.Buffer, n, choice uint64, k int64) {
	x := uint64(s.draw(n, 1000+choice) * (1 << 53))
	for i := int64(0); i < k; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		w := words[(x>>33)%uint64(len(words))]
		if i > 0 {
			b.WriteByte(' ')
		}
		if i%12 == 0 {
			b.WriteString(strings.ToUpper(w[:1]))
			b.WriteString(w[1:])
		} else {
			b.WriteString(w)
		}
		if i%12 == 11 || i == k-1 {
			b.WriteByte('.')
		}
	}
}

type embeddingOptions struct {
	dim    int
	base64 bool
}

func (s *Server) embeddingOptions(body []byte) (embeddingOptions, error) {
	var opts struct {
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     json.RawMessage `json:"dimensions"`
	}
	_ = json.Unmarshal(body, &opts)
	o := embeddingOptions{dim: s.cfg.EmbeddingDim, base64: opts.EncodingFormat == "base64"}
	if len(opts.Dimensions) > 0 && string(opts.Dimensions) != "null" {
		d, err := strconv.Atoi(string(opts.Dimensions))
		if err != nil || d < 1 || d > maxEmbeddingDim {
			return o, errors.New("'dimensions' must be an integer within [1, " + strconv.Itoa(maxEmbeddingDim) + "]")
		}
		o.dim = d
	}
	return o, nil
}

func (s *Server) embeddingResponse(n uint64, p *llm.ParsedRequest, prompt int64, o embeddingOptions) []byte {
	dim, b64 := o.dim, o.base64
	b := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(b)
	b.Reset()
	b.WriteString(`{"object":"list","data":[`)
	vec := make([]float32, dim)
	raw := make([]byte, 4*dim)
	for i := int64(0); i < p.Inputs; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		var norm float64
		for j := range vec {
			v := s.draw(n, uint64(1<<32)+uint64(i)<<16+uint64(j))*2 - 1
			vec[j] = float32(v)
			norm += v * v
		}
		norm = math.Sqrt(norm)
		b.WriteString(`{"object":"embedding","index":`)
		b.WriteString(itoa(i))
		b.WriteString(`,"embedding":`)
		if b64 {
			for j, v := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(float32(float64(v)/norm)))
			}
			b.WriteByte('"')
			b.WriteString(base64.StdEncoding.EncodeToString(raw))
			b.WriteByte('"')
		} else {
			b.WriteByte('[')
			var num []byte
			for j, v := range vec {
				if j > 0 {
					b.WriteByte(',')
				}
				num = strconv.AppendFloat(num[:0], float64(float32(float64(v)/norm)), 'g', -1, 32)
				b.Write(num)
			}
			b.WriteByte(']')
		}
		b.WriteByte('}')
	}
	b.WriteString(`],"model":`)
	appendJSONString(b, p.Model)
	if !s.omitsUsage(n) {
		b.WriteString(`,"usage":{"prompt_tokens":`)
		b.WriteString(itoa(prompt))
		b.WriteString(`,"total_tokens":`)
		b.WriteString(itoa(prompt))
		b.WriteString("}")
	}
	b.WriteString("}\n")
	return bytes.Clone(b.Bytes())
}
