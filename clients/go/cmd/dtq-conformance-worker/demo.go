package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"regexp"
	"sort"

	dtq "dtq/clients/go"
	"dtq/clients/go/dtqpb"
)

// The demo's task types (docs/protocol.md section 14, queue demo).

var wordRE = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)

const topWordsPerFile = 20

type filePayload struct {
	Path         string `json:"path"`
	FailAttempts *int   `json:"fail_attempts"`
}

type fileStats struct {
	Path       string          `json:"path"`
	Lines      int             `json:"lines"`
	Words      int             `json:"words"`
	Sha256     string          `json:"sha256"`
	TopWords   [][]interface{} `json:"top_words"`
	WorkerLang string          `json:"worker_lang"`
}

// FlakyError is the deliberate, retryable failure of file.flaky and file.poison
// (its type name is the error class, as in the other demo workers).
type FlakyError struct{ msg string }

func (e *FlakyError) Error() string { return e.msg }

// stats counts lines and words of a file and hashes its bytes.
func stats(path string) ([]byte, error) {
	raw, err := ioutil.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := bytes.Count(raw, []byte("\n"))
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		lines++
	}
	counts := map[string]int{}
	var order []string // first appearance, for ties
	words := 0
	for _, m := range wordRE.FindAll(raw, -1) {
		w := string(bytes.ToLower(m))
		if counts[w] == 0 {
			order = append(order, w)
		}
		counts[w]++
		words++
	}
	sort.SliceStable(order, func(i, j int) bool { return counts[order[i]] > counts[order[j]] })
	if len(order) > topWordsPerFile {
		order = order[:topWordsPerFile]
	}
	top := make([][]interface{}, 0, len(order))
	for _, w := range order {
		top = append(top, []interface{}{w, counts[w]})
	}
	sum := sha256.Sum256(raw)
	return json.Marshal(fileStats{path, lines, words, hex.EncodeToString(sum[:]), top, "go"})
}

func demoPayload(t *dtqpb.LeasedTask) (filePayload, error) {
	var p filePayload
	return p, decode(t.Payload, &p)
}

func registerDemo(w *dtq.Worker) {
	w.Handle("file.stats", func(_ context.Context, t *dtqpb.LeasedTask) ([]byte, error) {
		p, err := demoPayload(t)
		if err != nil {
			return nil, err
		}
		return stats(p.Path)
	})
	w.Handle("file.flaky", func(_ context.Context, t *dtqpb.LeasedTask) ([]byte, error) {
		p, err := demoPayload(t)
		if err != nil {
			return nil, err
		}
		limit := 1
		if p.FailAttempts != nil {
			limit = *p.FailAttempts
		}
		if int(t.Attempt) <= limit {
			return nil, &FlakyError{fmt.Sprintf("flaky failure on attempt %d", t.Attempt)}
		}
		return stats(p.Path)
	})
	w.Handle("file.poison", func(_ context.Context, t *dtqpb.LeasedTask) ([]byte, error) {
		return nil, &FlakyError{fmt.Sprintf("poison task failed on attempt %d of %d",
			t.Attempt, t.MaxAttempts)}
	})
	w.Handle("file.corrupt", func(_ context.Context, t *dtqpb.LeasedTask) ([]byte, error) {
		p, _ := demoPayload(t)
		return nil, &dtq.PermanentError{Message: fmt.Sprintf("refusing %s: marked corrupt", p.Path)}
	})
}
