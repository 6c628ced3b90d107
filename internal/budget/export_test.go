package budget

import "time"

// SetGuess makes b's first guess of the time come from f, so tests can drive
// the wrong-day path while the script keeps the real (or injected) time.
func SetGuess(b *Budgets, f func() time.Time) { b.guess = f }

// WrongDays counts the wrong-day replies b has had.
func WrongDays(b *Budgets) int64 { return b.wrongDays.Load() }

// StatusReads counts the reads b's Status calls made.
func StatusReads(b *Budgets) int { return b.statuses.Calls() }
