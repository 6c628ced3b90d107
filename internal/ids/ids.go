// Package ids makes the identifiers of llmq's objects: a type prefix, then 26
// characters of Crockford base32 whose first 10 encode the creation time in
// milliseconds and the rest 80 random bits. Ids of one type therefore sort in
// creation order, which cursor pagination relies on.
package ids

import (
	"crypto/rand"
	"strings"
	"time"
)

// Prefixes of the object types, as OpenAI spells them where OpenAI has the type.
const (
	Job    = "job_"
	Batch  = "batch_"
	File   = "file-"
	Tenant = "ten_"
	Key    = "key_"
)

const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// New returns a new id of the type prefix, stamped with the current time.
func New(prefix string) string { return NewAt(prefix, time.Now()) }

// NewAt returns a new id of the type prefix stamped with t.
func NewAt(prefix string, t time.Time) string {
	var out [26]byte
	ms := uint64(t.UnixMilli())
	for i := 9; i >= 0; i-- {
		out[i] = alphabet[ms&31]
		ms >>= 5
	}
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	// 80 random bits -> 16 base32 characters.
	var acc uint64
	bits := 0
	j := 10
	for _, b := range rnd {
		acc = acc<<8 | uint64(b)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out[j] = alphabet[(acc>>uint(bits))&31]
			j++
		}
	}
	return prefix + string(out[:])
}

// Valid reports whether id has the type prefix and a well-formed body.
func Valid(prefix, id string) bool {
	body, ok := strings.CutPrefix(id, prefix)
	if !ok || len(body) != 26 {
		return false
	}
	for i := 0; i < len(body); i++ {
		if strings.IndexByte(alphabet, body[i]) < 0 {
			return false
		}
	}
	return true
}
