package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// MooncakeBlockTokens is the block size of the Mooncake trace's hash_ids.
const MooncakeBlockTokens = 512

type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	BlockTokens  int      `json:"block_tokens"` // optional; 0 means 512 (warmpath's own samples say 64)
	Model        string   `json:"model"`        // optional; overrides the model argument
}

// ReadMooncake parses a Mooncake-format trace (JSON lines with timestamp in
// milliseconds, input_length, output_length, and hash_ids, one per 512-token
// block; optional block_tokens and model, as warmpath's recorded samples
// carry). Each hash id becomes a Segment, so equal ids give equal bytes; the
// last block is cut to the input length. timeScale multiplies the arrival
// times (0.5 replays twice as fast); 0 means 1.
func ReadMooncake(r io.Reader, model string, timeScale float64) (*Workload, error) {
	if model == "" {
		model = DefaultModel
	}
	if timeScale == 0 {
		timeScale = 1
	}
	if timeScale < 0 {
		return nil, fmt.Errorf("mooncake: time scale must be > 0, got %g", timeScale)
	}
	w := &Workload{Name: "mooncake", Params: params("time_scale", timeScale)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("mooncake line %d: %w", line, err)
		}
		switch {
		case m.Timestamp == nil:
			return nil, fmt.Errorf("mooncake line %d: missing field timestamp", line)
		case m.InputLength == nil || *m.InputLength <= 0:
			return nil, fmt.Errorf("mooncake line %d: input_length must be > 0", line)
		case m.OutputLength == nil || *m.OutputLength <= 0:
			return nil, fmt.Errorf("mooncake line %d: output_length must be > 0", line)
		case m.BlockTokens < 0:
			return nil, fmt.Errorf("mooncake line %d: block_tokens must be > 0", line)
		}
		bt := m.BlockTokens
		if bt == 0 {
			bt = MooncakeBlockTokens
		}
		if len(m.HashIDs) != (*m.InputLength+bt-1)/bt {
			return nil, fmt.Errorf("mooncake line %d: hash_ids has %d ids, input_length %d needs %d", line,
				len(m.HashIDs), *m.InputLength, (*m.InputLength+bt-1)/bt)
		}
		segs := make([]Segment, len(m.HashIDs))
		left := *m.InputLength
		for i, id := range m.HashIDs {
			n := min(left, bt)
			segs[i] = Segment{ID: segID("mooncake", 0, int(id>>32), int(id)), Tokens: n}
			left -= n
		}
		rm := model
		if m.Model != "" {
			rm = m.Model
		}
		w.Requests = append(w.Requests, Request{
			Arrival: int64(*m.Timestamp * 1e6 * timeScale), Model: rm, OutputTokens: *m.OutputLength,
			Messages: []Message{{Role: User, Segments: segs}},
			// The trace names no client or session, and most of its
			// requests share their first block (a common system prompt), so
			// a key made from the hash ids would make one session of
			// unrelated users: each request is its own client instead.
			Group: int(m.HashIDs[0]), Conversation: -1, Client: line - 1,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mooncake line %d: %w", line+1, err)
	}
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("mooncake: trace has no requests")
	}
	w.sortByArrival()
	return w, nil
}

// LoadMooncake reads a Mooncake trace file.
func LoadMooncake(path, model string, timeScale float64) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mooncake: %w", err)
	}
	defer f.Close()
	return ReadMooncake(f, model, timeScale)
}
