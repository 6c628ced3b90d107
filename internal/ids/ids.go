// Package ids makes the identifiers of llmq's objects: a type prefix, then 26
// characters of Crockford base32 whose first 10 encode the creation time in
// milliseconds and the rest 80 random bits. Ids of one type therefore sort in
// creation order, which cursor pagination relies on.
package ids

import (
	"crypto/rand"
	"strings"
	"sync"
	"time"
)

// Prefixes of the object types, as OpenAI spells them where OpenAI has the type.
const (
	Job    = "job_"
	Batch  = "batch_"
	File   = "file-"
	Tenant = "ten_"
	Key    = "key_"
	// BatchPart is a part of a batch offloaded to a provider's Batch API.
	BatchPart = "bpart_"
)

const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// last is the newest id New made in this process, so that ids made within
// one millisecond still sort in the order they were made: the next takes
// the same time and its random part plus one.
var last struct {
	sync.Mutex
	ms  uint64
	rnd [10]byte
}

// New returns a new id of the type prefix, stamped with the current time,
// after every id New made before in this process.
func New(prefix string) string {
	ms := uint64(time.Now().UnixMilli())
	last.Lock()
	if ms <= last.ms {
		ms = last.ms
		for i := len(last.rnd) - 1; i >= 0; i-- {
			last.rnd[i]++
			if last.rnd[i] != 0 {
				break
			}
		}
	} else {
		last.ms = ms
		_, _ = rand.Read(last.rnd[:])
	}
	rnd := last.rnd
	last.Unlock()
	return encode(prefix, ms, rnd)
}

// NewAt returns a new id of the type prefix stamped with t.
func NewAt(prefix string, t time.Time) string {
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	return encode(prefix, uint64(t.UnixMilli()), rnd)
}

func encode(prefix string, ms uint64, rnd [10]byte) string {
	var out [26]byte
	for i := 9; i >= 0; i-- {
		out[i] = alphabet[ms&31]
		ms >>= 5
	}
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
