// Long because it is one job: the engine's step loop (scheduling, chunked
// prefill, decode, preemption, prefix-cache commits) is one state machine over
// one lock.

package enginesim

import (
	"errors"
	"math"
	"slices"
	"time"

	"github.com/zeebo/xxh3"
)

// NoEvent is NextEventTime's answer when the engine has nothing to do.
const NoEvent int64 = math.MaxInt64

// Errors returned by Submit. Preallocated: the cluster simulator submits
// millions of requests.
var (
	ErrEmptyPrompt   = errors.New("empty prompt")
	ErrPromptTooLong = errors.New("prompt plus output tokens exceed max_model_len")
	ErrKVCapacity    = errors.New("request needs more KV blocks than the cache has")
	ErrInFlight      = errors.New("request already submitted")
	ErrPromptTail    = errors.New("PromptBytes set but BlockHashes or the prompt tail do not match it")
)

// FinishReason says why a request stopped generating.
type FinishReason uint8

const (
	FinishNone   FinishReason = iota // still running
	FinishStop                       // sampled length reached; the last token is EOS
	FinishLength                     // max_tokens (or max_model_len) reached
	FinishAbort                      // aborted by the caller or a restart
)

func (f FinishReason) String() string {
	switch f {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishAbort:
		return "abort"
	}
	return ""
}

// Request is one generation request as the engine sees it. The caller owns
// it; the engine writes the result fields. The engine reads Prompt only in
// Submit (it keeps the bytes of the prompt's last partial block), so the
// caller may reuse the buffer once Submit returns. A Request may be
// resubmitted after it finished (with its Prompt set again).
type Request struct {
	// ID keys the generated text and the sampled output length: the same
	// ID and Seed give the same output on every engine.
	ID uint64
	// Prompt is the token stream's bytes as the engine sees it (chat
	// template already applied; see AppendChatPrompt). 4 bytes per token.
	Prompt []byte
	// Adapter is the LoRA adapter name, "" for the base model. Adapters
	// and CacheSalt each get their own KV namespace (no sharing).
	Adapter   string
	CacheSalt string
	// MaxTokens > 0 generates exactly that many tokens (finish "length");
	// 0 samples a length from Config.OutputLen (finish "stop").
	MaxTokens int
	// Data is for the caller (the HTTP server keeps its flight here).
	Data any
	// BlockHashes, when set, are the chained hashes of Prompt's full
	// blocks, as BlockHashes(nil, Prompt, BlockSize, Adapter, CacheSalt)
	// returns them: a caller that submits the same prompt many times (the
	// cluster simulator replays a workload once per policy and load)
	// computes them once. Submit copies them and hashes the prompt itself
	// when their count does not match.
	BlockHashes []uint64
	// PromptBytes > 0 says Prompt holds only the prompt's bytes after its
	// last full block, and the whole prompt is PromptBytes long: with
	// BlockHashes, that is all the engine reads of a prompt (the tail
	// starts the first block of generated tokens). Submit fails with
	// ErrPromptTail unless BlockHashes covers every full block and Prompt
	// is exactly the tail.
	PromptBytes int

	// Written by the engine.
	PromptTokens int          // ceil(len(Prompt)/4)
	OutputTarget int          // tokens this request will generate
	CachedTokens int          // prefix-cache hit when first scheduled
	OutputTokens int          // generated so far
	Preemptions  int          // times preempted (KV recomputed)
	Arrival      int64        // Submit time
	ScheduledAt  int64        // start of the first step that ran it
	FirstTokenAt int64        // end of the step that produced token 1
	FinishedAt   int64        // end of the last step (or abort time)
	Finish       FinishReason // FinishNone while in flight

	eos    bool   // the last token is EOS (sampled length)
	outKey uint64 // keys outputWord
	seq    *seq
}

// TTFT is the time from arrival to the first token (0 before it).
func (r *Request) TTFT() time.Duration {
	if r.OutputTokens == 0 {
		return 0
	}
	return time.Duration(r.FirstTokenAt - r.Arrival)
}

// IsEOS reports whether output token j is the end-of-sequence token (which
// counts as a completion token but carries no text).
func (r *Request) IsEOS(j int) bool { return r.eos && j == r.OutputTarget-1 }

// AppendOutput appends the text of output tokens [from, to) to dst.
func (r *Request) AppendOutput(dst []byte, from, to int) []byte {
	for j := from; j < to; j++ {
		if !r.IsEOS(j) {
			dst = append(dst, outputWord(r.outKey, j)...)
		}
	}
	return dst
}

// tokenText is output token j's bytes in the KV stream (EOS included).
func (r *Request) tokenText(j int) string {
	if r.IsEOS(j) {
		return eosText
	}
	return outputWord(r.outKey, j)
}

// Observer receives the engine's events, in virtual time, from Advance.
// Callbacks may Submit (at the event's time, e.g. the next turn of a chat
// or a resubmission of r from OnFinish) and Abort, but not Reset.
type Observer interface {
	// OnToken: r produced output token r.OutputTokens at time at (the
	// first one when r.OutputTokens == 1).
	OnToken(r *Request, at int64)
	// OnFinish: r finished at time at (after its last OnToken).
	OnFinish(r *Request, at int64)
}

const (
	stWaiting uint8 = iota
	stRunning
	stDone
)

// seq is the engine's per-request state, pooled.
type seq struct {
	req       *Request
	root      uint64   // hash chain seed: adapter + salt namespace
	hashes    []uint64 // chained hashes of the full blocks of the token stream
	tail      []byte   // the prompt's bytes after its last full block
	blocks    []int32  // block table
	promptLen int
	numTokens int // prompt + generated
	target    int // output tokens to generate
	computed  int // tokens whose KV is in blocks
	committed int // leading blocks registered in the prefix cache
	// held is the block caching hashes[committed-1], -1 none; run says
	// it is blocks[committed-1], committed by this request (blockPool.commit)
	held      int32
	run       bool
	numNew    int // tokens scheduled in the current step
	arrival   int64
	slot      int // llama.cpp slot model: the slot it runs in, -1 none
	state     uint8
	inBatch   bool
	scheduled bool
}

// slot is one llama.cpp server slot (Config.Slots): the chained block
// hashes of the last request it ran, kept as its prompt cache.
type slot struct {
	hashes   []uint64
	lastUsed int64
	busy     bool
}

// Engine is the deterministic virtual-time core: paged KV cache with
// automatic prefix caching, a continuous-batching scheduler and the step
// time model. No goroutines, no clock: the caller passes times in
// nanoseconds. Not safe for concurrent use.
type Engine struct {
	bs        int
	maxSeqs   int
	budget    int
	maxLen    int
	caching   bool
	timing    Timing
	outLen    OutputLen
	seed      uint64
	capTokens int
	slots     []slot // llama.cpp slot model; nil: paged prefix cache
	// ram is the slot model's host prompt cache (Config.CacheRAMTokens),
	// oldest first; ramBlocks their total blocks, ramCap the budget.
	ram               [][]uint64
	ramBlocks, ramCap int

	pool    *blockPool
	waiting seqQueue
	running []*seq
	batch   []*seq
	spare   []*seq
	hits    []int32
	scratch []byte

	stepActive bool
	stepStart  int64
	stepEnd    int64
	pendingAt  int64
	lastDur    time.Duration

	st EngineStats
}

// EngineStats are cumulative counters and current gauges.
type EngineStats struct {
	Waiting, Running        int
	UsedBlocks, TotalBlocks int
	PrefixQueries           uint64 // tokens looked up in the prefix cache, at every admission (re-admissions after preemption too)
	PrefixHits              uint64 // tokens found, likewise
	// FirstPromptTokens and FirstCachedTokens count each request once, when
	// it is first scheduled: its prompt and its cached prefix then (what
	// usage.prompt_tokens_details.cached_tokens reports). A re-admission
	// after preemption hits its own recomputed blocks and counts only in
	// PrefixQueries/PrefixHits.
	FirstPromptTokens   uint64
	FirstCachedTokens   uint64
	Evictions           uint64 // cached blocks reused for new content
	Preemptions         uint64
	Steps               uint64
	Submitted, Finished uint64
	Aborted             uint64
	PromptTokens        uint64 // computed prefill tokens (cache misses)
	GenerationTokens    uint64
	BusyTime            time.Duration // sum of step durations
}

// KVUsage is the fraction of blocks referenced by requests (vLLM's
// kv_cache_usage_perc, 0..1).
func (s EngineStats) KVUsage() float64 {
	if s.TotalBlocks == 0 {
		return 0
	}
	return float64(s.UsedBlocks) / float64(s.TotalBlocks)
}

// NewEngine builds an engine from the model fields of cfg (the HTTP and
// fault fields are ignored).
func NewEngine(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		bs:        cfg.BlockSize,
		maxSeqs:   cfg.MaxNumSeqs,
		budget:    cfg.MaxNumBatchedTokens,
		maxLen:    cfg.MaxModelLen,
		caching:   !cfg.DisablePrefixCaching,
		timing:    cfg.Timing,
		outLen:    cfg.OutputLen,
		seed:      cfg.Seed,
		capTokens: cfg.NumGPUBlocks * cfg.BlockSize,
		pool:      newBlockPool(cfg.NumGPUBlocks),
		scratch:   make([]byte, 0, cfg.BlockSize*BytesPerToken),
		pendingAt: NoEvent,
	}
	e.spare, e.pool.seqs = e.pool.seqs, nil // a released engine's, if the pool was
	if cfg.Slots > 0 {
		// llama.cpp: n_ctx split evenly across the slots, whole blocks
		e.slots = make([]slot, cfg.Slots)
		e.maxSeqs = cfg.Slots
		e.capTokens = cfg.NumGPUBlocks / cfg.Slots * cfg.BlockSize
		e.ramCap = cfg.CacheRAMTokens / cfg.BlockSize
	}
	return e, nil
}

// Stats returns the counters and gauges.
func (e *Engine) Stats() EngineStats {
	s := e.st
	s.Waiting = e.waiting.len()
	s.Running = len(e.running)
	s.UsedBlocks = e.pool.used()
	s.TotalBlocks = e.pool.total()
	s.Evictions = e.pool.evictions
	return s
}

// BlockSize returns the tokens per KV block.
func (e *Engine) BlockSize() int { return e.bs }

// LastStep returns the current (or last) step's start and duration.
func (e *Engine) LastStep() (start int64, dur time.Duration) { return e.stepStart, e.lastDur }

// Submit queues r, arriving at now. It is considered by the first step
// that starts at or after now.
func (e *Engine) Submit(r *Request, now int64) error {
	if r.seq != nil {
		return ErrInFlight
	}
	n := len(r.Prompt)
	if r.PromptBytes > 0 {
		n = r.PromptBytes
	}
	p := tokensOf(n)
	if p == 0 {
		return ErrEmptyPrompt
	}
	tailFrom := min(p/e.bs*e.bs*BytesPerToken, n) // the prompt's bytes after its last full block
	if r.PromptBytes > 0 && (len(r.BlockHashes) != p/e.bs || len(r.Prompt) != n-tailFrom) {
		return ErrPromptTail
	}
	key := splitmix64(e.seed*0x9e3779b97f4a7c15 ^ splitmix64(r.ID))
	target, eos := r.MaxTokens, false
	if target <= 0 {
		target, eos = e.sampleLen(key), true
		if p+target > e.maxLen {
			target, eos = e.maxLen-p, false
		}
	}
	if target < 1 || p+target > e.maxLen {
		return ErrPromptTooLong
	}
	if p+target-1 > e.capTokens {
		return ErrKVCapacity
	}
	s := e.newSeq()
	nb := e.blocksFor(p + target) // room for the whole token stream
	s.hashes, s.blocks = slices.Grow(s.hashes, nb), slices.Grow(s.blocks, nb)
	s.req = r
	s.promptLen, s.numTokens, s.target = p, p, target
	s.arrival = now
	s.state = stWaiting
	s.slot = -1
	s.root = hashRoot(r.Adapter, r.CacheSalt)
	*r = Request{ID: r.ID, Prompt: r.Prompt, Adapter: r.Adapter, CacheSalt: r.CacheSalt,
		MaxTokens: r.MaxTokens, Data: r.Data, BlockHashes: r.BlockHashes, PromptBytes: r.PromptBytes,
		PromptTokens: p, OutputTarget: target, Arrival: now, eos: eos, outKey: key, seq: s}
	if len(r.BlockHashes) == p/e.bs {
		s.hashes = append(s.hashes, r.BlockHashes...)
	} else {
		s.hashes = appendBlockHashes(s.hashes, r.Prompt, e.bs, s.root)
	}
	if r.PromptBytes > 0 {
		s.tail = append(s.tail[:0], r.Prompt...)
	} else {
		s.tail = append(s.tail[:0], r.Prompt[tailFrom:]...)
	}
	e.waiting.pushBack(s)
	e.st.Submitted++
	if !e.stepActive && now < e.pendingAt {
		e.pendingAt = now
	}
	return nil
}

// BlockHashes appends to dst the chained hashes of the full blocks of
// prompt (engine form) for the given LoRA adapter and cache salt, as Submit
// computes them: Request.BlockHashes.
func BlockHashes(dst []uint64, prompt []byte, blockSize int, adapter, salt string) []uint64 {
	return appendBlockHashes(dst, prompt, blockSize, hashRoot(adapter, salt))
}

// PromptTail is the part of prompt (engine form) after its last full
// block: what Request.Prompt holds when Request.PromptBytes is set.
func PromptTail(prompt []byte, blockSize int) []byte {
	return prompt[min(tokensOf(len(prompt))/blockSize*blockSize*BytesPerToken, len(prompt)):]
}

// hashRoot seeds a hash chain: the adapter and salt's KV namespace.
func hashRoot(adapter, salt string) uint64 {
	return xxh3.HashStringSeed(salt, xxh3.HashString(adapter)^0x5eed)
}

// appendBlockHashes hashes prompt's full blocks, each chained to the one
// before (the first to root), as hashBlock does.
func appendBlockHashes(dst []uint64, prompt []byte, bs int, root uint64) []uint64 {
	step := bs * BytesPerToken
	parent := root
	for k := range tokensOf(len(prompt)) / bs {
		h := xxh3.HashSeed(prompt[k*step:min((k+1)*step, len(prompt))], parent)
		if h == 0 {
			h = 1
		}
		dst = append(dst, h)
		parent = h
	}
	return dst
}

// sampleLen draws a log-normal output length keyed by the request.
func (e *Engine) sampleLen(key uint64) int {
	o := e.outLen
	u1 := (float64(splitmix64(key^1)>>11) + 0.5) / (1 << 53)
	u2 := float64(splitmix64(key^2)>>11) / (1 << 53)
	z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	n := int(math.Round(float64(o.Median) * math.Exp(o.Sigma*z)))
	return min(max(n, o.Min), o.Max)
}

// hashBlock returns the chained hash of full block k of s's token stream.
func (e *Engine) hashBlock(s *seq, k int) uint64 {
	r := s.req
	lo, hi := k*e.bs, (k+1)*e.bs
	var b []byte
	if hi <= s.promptLen {
		b = r.Prompt[lo*BytesPerToken : min(hi*BytesPerToken, len(r.Prompt))]
	} else {
		b = e.scratch[:0]
		if lo < s.promptLen {
			b = append(b, s.tail...) // lo is the last full block's end
		}
		for t := max(lo, s.promptLen); t < hi; t++ {
			b = append(b, r.tokenText(t-s.promptLen)...)
		}
		e.scratch = b
	}
	parent := s.root
	if k > 0 {
		parent = s.hashes[k-1]
	}
	h := xxh3.HashSeed(b, parent)
	if h == 0 {
		h = 1
	}
	return h
}

// NextEventTime is when the next step starts (a request is waiting and the
// engine is idle) or ends; NoEvent when there is nothing to do.
func (e *Engine) NextEventTime() int64 {
	if e.stepActive {
		return e.stepEnd
	}
	return e.pendingAt
}

// Idle reports whether no request is waiting or running.
func (e *Engine) Idle() bool { return e.waiting.len() == 0 && len(e.running) == 0 }

// Advance runs every step that ends at or before until, calling obs (may be
// nil) for each token and finish. It returns the number of steps completed.
func (e *Engine) Advance(until int64, obs Observer) int {
	n := 0
	for {
		if e.stepActive {
			if e.stepEnd > until {
				return n
			}
			e.complete(obs)
			n++
			e.plan(e.stepEnd)
			continue
		}
		if e.pendingAt != NoEvent && e.pendingAt <= until {
			t := e.pendingAt
			e.pendingAt = NoEvent
			e.plan(t)
			continue
		}
		return n
	}
}

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.bs - 1) / e.bs }

// plan schedules the step starting at t (vLLM V1 order: running requests
// first, preempting from the back when KV runs out, then waiting requests
// unless something was preempted).
func (e *Engine) plan(t int64) {
	e.pendingAt = NoEvent // this step considers everything that arrived by t
	e.batch = e.batch[:0]
	budget := e.budget
	prefill, decodes, ctx := 0, 0, 0
	chunks, before := 0, 0 // prefill chunks, and the tokens in context before them
	var pairs int64        // prefill attention (query, key) pairs
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(s.numTokens-s.computed, budget)
		need := e.blocksFor(s.computed+n) - len(s.blocks)
		for need > e.pool.nfree {
			v := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(v)
			preempted = true
			if v == s {
				s = nil
				break
			}
		}
		if s == nil {
			break
		}
		s.blocks = e.pool.allocN(s.blocks, need)
		if n == 1 && s.numTokens > s.promptLen && s.computed == s.numTokens-1 {
			decodes++
			ctx += s.computed
		} else {
			prefill += n
			pairs += int64(n)*int64(s.computed) + int64(n)*int64(n+1)/2
			chunks++
			before += s.computed
		}
		s.numNew = n
		s.inBatch = true
		e.batch = append(e.batch, s)
		budget -= n
	}
	for !preempted && e.waiting.len() > 0 && len(e.running) < e.maxSeqs && budget > 0 {
		s := e.waiting.front()
		if s.arrival > t {
			break
		}
		e.hits = e.hits[:0]
		computed, sl, save := 0, -1, false
		if e.slots != nil {
			var hit int
			sl, hit, save = e.pickSlot(s)
			if save && e.ramCap > 0 {
				_, k := e.ramBest(s, e.slots[sl].hashes)
				hit = max(hit, min(k, (s.numTokens-1)/e.bs))
			}
			computed = hit * e.bs
		} else if e.caching {
			maxHit := min((s.numTokens-1)/e.bs, len(s.hashes))
			prev := int32(-1)
			for k := range maxHit {
				b := e.pool.lookupAfter(prev, s.hashes[k])
				if b < 0 {
					break
				}
				e.hits = append(e.hits, b)
				prev = b
			}
			computed = len(e.hits) * e.bs
		}
		n := min(s.numTokens-computed, budget)
		need := e.blocksFor(computed+n) - len(e.hits) // slot model: its whole context is its own
		avail := e.pool.nfree
		for _, b := range e.hits {
			if e.pool.free(b) {
				avail--
			}
		}
		if need > avail {
			break
		}
		for _, b := range e.hits {
			e.pool.touch(b)
		}
		s.blocks = append(s.blocks, e.hits...)
		s.blocks = e.pool.allocN(s.blocks, need)
		s.computed, s.committed = computed, len(e.hits)
		s.held, s.run = -1, false
		if len(e.hits) > 0 {
			s.held = e.hits[len(e.hits)-1]
		}
		if sl >= 0 {
			s.slot = sl
			if save && e.ramCap > 0 {
				// llama.cpp saves the slot's prompt (evicting the
				// oldest to make room), then loads the best cached one,
				// which leaves the cache
				own := e.slots[sl].hashes
				e.ramSave(own)
				if at, _ := e.ramBest(s, own); at >= 0 {
					e.ramDrop(at)
				}
			}
			e.slots[sl].busy = true
			s.committed = computed / e.bs
		}
		if e.caching || e.slots != nil {
			e.st.PrefixQueries += uint64(s.numTokens)
			e.st.PrefixHits += uint64(computed)
		}
		if !s.scheduled {
			s.scheduled = true
			s.req.CachedTokens = computed
			s.req.ScheduledAt = t
			e.st.FirstPromptTokens += uint64(s.promptLen)
			e.st.FirstCachedTokens += uint64(computed)
		}
		e.waiting.popFront()
		s.state = stRunning
		e.running = append(e.running, s)
		s.numNew = n
		s.inBatch = true
		e.batch = append(e.batch, s)
		budget -= n
		prefill += n
		pairs += int64(n)*int64(computed) + int64(n)*int64(n+1)/2
		chunks++
		before += computed
	}
	if len(e.batch) == 0 {
		e.stepActive = false
		if e.waiting.len() > 0 && e.waiting.front().arrival > t {
			e.pendingAt = e.waiting.front().arrival
		}
		return
	}
	tm := e.timing
	dur := tm.StepBase + time.Duration(prefill)*tm.PerPrefillToken +
		time.Duration(decodes)*tm.PerDecodeSeq + time.Duration(ctx)*tm.PerContextToken +
		time.Duration(pairs*int64(tm.PerPrefillKPairs)/1000) +
		time.Duration(chunks)*tm.PerPrefillChunk + time.Duration(before)*tm.PerChunkContextToken
	e.stepActive = true
	e.stepStart, e.stepEnd, e.lastDur = t, t+int64(dur), dur
	e.st.Steps++
	e.st.BusyTime += dur
	e.st.PromptTokens += uint64(prefill)
}

// preempt frees v's blocks and puts it back at the head of the queue; it
// will recompute its prompt and generated tokens (vLLM's RECOMPUTE mode).
func (e *Engine) preempt(v *seq) {
	e.freeBlocks(v)
	e.releaseSlot(v, 0, -1)
	v.computed, v.committed = 0, 0
	v.state = stWaiting
	v.req.Preemptions++
	e.st.Preemptions++
	e.waiting.pushFront(v)
}

// freeBlocks releases s's blocks tail first, so its last blocks are
// evicted before its first ones (vLLM frees in reverse order).
func (e *Engine) freeBlocks(s *seq) {
	e.pool.releaseAll(s.blocks)
	s.blocks = s.blocks[:0]
}

// complete applies the current step at its end time.
func (e *Engine) complete(obs Observer) {
	at := e.stepEnd
	e.stepActive = false
	finished := false
	for _, s := range e.batch {
		s.inBatch = false
		if s.state != stRunning {
			if s.req == nil { // aborted during the step
				e.recycle(s)
			}
			continue
		}
		s.computed += s.numNew
		s.numNew = 0
		if e.caching && e.slots == nil {
			k := s.committed
			end := min(s.computed/e.bs, len(s.hashes))
			if k < end && k > 0 && !s.run && e.pool.blk[s.held].hash != s.hashes[k-1] {
				// blocks[k-1] stayed anonymous, and the block that cached
				// its hash for another request was evicted since: find the
				// block caching it now, if any
				s.held = -1
				for j := range k {
					s.held = e.pool.lookupAfter(s.held, s.hashes[j])
				}
			}
			if k < end {
				s.held, s.run = e.pool.commitChain(s.blocks[k:end], s.hashes[k:end], s.held, s.run)
				s.committed = end
			}
		}
		if s.computed < s.numTokens {
			continue // chunked prefill not done yet
		}
		r := s.req
		s.numTokens++
		r.OutputTokens = s.numTokens - s.promptLen
		e.st.GenerationTokens++
		if r.OutputTokens == 1 {
			r.FirstTokenAt = at
		}
		if s.numTokens%e.bs == 0 {
			s.hashes = append(s.hashes, e.hashBlock(s, s.numTokens/e.bs-1))
		}
		done := r.OutputTokens >= s.target
		if done {
			r.Finish = FinishLength
			if r.eos {
				r.Finish = FinishStop
			}
			r.FinishedAt = at
			r.seq = nil // OnFinish may resubmit r
			e.releaseSlot(s, at, len(s.hashes))
			e.freeBlocks(s)
			s.state = stDone
			finished = true
			e.st.Finished++
		}
		if obs != nil {
			obs.OnToken(r, at)
			if done {
				obs.OnFinish(r, at)
			}
		}
	}
	if finished {
		kept := e.running[:0]
		for _, s := range e.running {
			if s.state == stRunning {
				kept = append(kept, s)
			} else {
				e.recycle(s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
}

// Abort removes r from the engine, freeing its blocks. It reports whether
// r was in flight.
func (e *Engine) Abort(r *Request, now int64) bool {
	s := r.seq
	if s == nil || s.req != r {
		return false
	}
	switch s.state {
	case stWaiting:
		e.waiting.remove(s)
	case stRunning:
		for i, x := range e.running {
			if x == s {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
	}
	e.releaseSlot(s, now, s.computed/e.bs)
	e.freeBlocks(s)
	r.Finish, r.FinishedAt, r.seq = FinishAbort, now, nil
	e.st.Aborted++
	s.state = stDone
	s.req = nil
	if !s.inBatch {
		e.recycle(s)
	}
	return true
}

// Reset wipes the engine (a restart): every in-flight request is dropped
// without events and the prefix cache is emptied. Counters are kept.
func (e *Engine) Reset() {
	drop := func(s *seq) {
		if s.req != nil {
			s.req.seq = nil
			if s.req.Finish == FinishNone {
				s.req.Finish = FinishAbort
			}
		}
		s.inBatch = false
		e.recycle(s)
	}
	for e.waiting.len() > 0 {
		drop(e.waiting.popFront())
	}
	for _, s := range e.running {
		drop(s)
	}
	for _, s := range e.batch {
		if s.inBatch { // aborted during the step, not yet recycled
			drop(s)
		}
	}
	clear(e.running)
	e.running = e.running[:0]
	e.batch = e.batch[:0]
	e.pool.reset()
	for i := range e.slots {
		e.slots[i] = slot{hashes: e.slots[i].hashes[:0]}
	}
	e.stepActive = false
	e.pendingAt = NoEvent
}

// FreshSlots is how many of the llama.cpp slot model's slots hold no
// prompt and run nothing (llama.cpp /slots: a slot that never ran a
// task); 0 for a paged cache.
func (e *Engine) FreshSlots() int {
	n := 0
	for i := range e.slots {
		if s := &e.slots[i]; !s.busy && len(s.hashes) == 0 {
			n++
		}
	}
	return n
}

// Release gives the engine's KV cache and its pooled request state to a
// later NewEngine of the same size (the cluster simulator's next run).
// The engine must not be used afterwards.
func (e *Engine) Release() {
	if e.pool != nil {
		e.pool.seqs, e.spare = e.spare, nil
		spare.give(e.pool)
		e.pool = nil
	}
}

// pickSlot is llama.cpp's slot choice for s (server get_available_slot):
// among idle slots, the one whose cached prompt shares the largest fraction
// of s's blocks, if above 0.1 (--slot-prompt-similarity default); else the
// least recently used idle slot. It returns the slot and the blocks s
// reuses from it (at most all but the last prompt token, as llama.cpp
// always evaluates the last one). The caller checks a slot is free
// (running < Slots).
//
// save reports whether llama.cpp then saves the slot's prompt to its host
// prompt cache and looks there for a better one (Config.CacheRAMTokens):
// the slot was taken as least recently used, or keeps under half its
// tokens; never for an empty slot.
func (e *Engine) pickSlot(s *seq) (slot, hit int, save bool) {
	maxHit := min((s.numTokens-1)/e.bs, len(s.hashes))
	best, bestHit, lru := -1, 0, -1
	for i := range e.slots {
		sl := &e.slots[i]
		if sl.busy {
			continue
		}
		if lru < 0 || sl.lastUsed < e.slots[lru].lastUsed {
			lru = i
		}
		k := 0
		for k < maxHit && k < len(sl.hashes) && sl.hashes[k] == s.hashes[k] {
			k++
		}
		if k > bestHit && float64(k*e.bs) > 0.1*float64(s.numTokens) {
			best, bestHit = i, k
		}
	}
	if best >= 0 {
		return best, bestHit, 2*bestHit < len(e.slots[best].hashes)
	}
	for hit < maxHit && hit < len(e.slots[lru].hashes) && e.slots[lru].hashes[hit] == s.hashes[hit] {
		hit++
	}
	return lru, hit, len(e.slots[lru].hashes) > 0
}

// ramBest is the host-cache prompt llama.cpp loads for s into a slot
// holding own (server_prompt_cache::load): from the oldest, each cached
// prompt sharing at least a quarter of itself with s that beats the best
// so far (own first) on both the part of itself it keeps and the part of
// s it covers. It returns its index (-1: none) and the blocks it shares.
func (e *Engine) ramBest(s *seq, own []uint64) (at, shared int) {
	at, shared = -1, commonBlocks(own, s.hashes)
	keep := -1.0
	if len(own) > 0 {
		keep = float64(shared) / float64(len(own))
	}
	for i, h := range e.ram {
		k := commonBlocks(h, s.hashes)
		f := float64(k) / float64(len(h))
		if f < 0.25 {
			continue
		}
		if keep < f && shared < k {
			at, shared, keep = i, k, f
		}
	}
	return at, shared
}

// commonBlocks is how many leading blocks a and b share.
func commonBlocks(a, b []uint64) int {
	k := 0
	for k < len(a) && k < len(b) && a[k] == b[k] {
		k++
	}
	return k
}

// ramSave puts prompt in the host cache (server_prompt_cache::alloc):
// nothing when a cached prompt covers it or it alone is over the budget,
// else the cached prompts it covers leave, the oldest go until it fits,
// and it is added as the newest.
func (e *Engine) ramSave(prompt []uint64) {
	if len(prompt) == 0 || len(prompt) > e.ramCap {
		return
	}
	for _, h := range e.ram {
		if commonBlocks(h, prompt) == len(prompt) {
			return
		}
	}
	kept := e.ram[:0]
	for _, h := range e.ram {
		if commonBlocks(h, prompt) == len(h) {
			e.ramBlocks -= len(h)
			continue
		}
		kept = append(kept, h)
	}
	clear(e.ram[len(kept):])
	e.ram = kept
	for len(e.ram) > 0 && e.ramBlocks+len(prompt) > e.ramCap {
		e.ramDrop(0)
	}
	e.ram = append(e.ram, append([]uint64(nil), prompt...))
	e.ramBlocks += len(prompt)
}

// ramDrop takes cached prompt i out of the host cache (loaded into a slot,
// or evicted).
func (e *Engine) ramDrop(i int) {
	e.ramBlocks -= len(e.ram[i])
	e.ram = append(e.ram[:i], e.ram[i+1:]...)
}

// releaseSlot frees s's slot (llama.cpp model), keeping the first keep
// block hashes of s as the slot's prompt cache (-1: the slot keeps nothing,
// its context was freed by a preemption).
func (e *Engine) releaseSlot(s *seq, at int64, keep int) {
	if s.slot < 0 || e.slots == nil {
		return
	}
	sl := &e.slots[s.slot]
	sl.busy = false
	sl.hashes = sl.hashes[:0]
	if keep > 0 {
		sl.hashes = append(sl.hashes, s.hashes[:min(keep, len(s.hashes))]...)
		sl.lastUsed = at
	}
	s.slot = -1
}

func (e *Engine) newSeq() *seq {
	if n := len(e.spare); n > 0 {
		s := e.spare[n-1]
		e.spare = e.spare[:n-1]
		return s
	}
	return &seq{}
}

func (e *Engine) recycle(s *seq) {
	*s = seq{hashes: s.hashes[:0], blocks: s.blocks[:0], tail: s.tail[:0], slot: -1}
	e.spare = append(e.spare, s)
}

// seqQueue is a FIFO ring with push-front for preempted requests.
type seqQueue struct {
	buf  []*seq
	head int
	n    int
}

func (q *seqQueue) len() int { return q.n }

func (q *seqQueue) grow() {
	nb := make([]*seq, max(16, 2*len(q.buf)))
	for i := range q.n {
		nb[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = nb, 0
}

func (q *seqQueue) pushBack(s *seq) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)%len(q.buf)] = s
	q.n++
}

func (q *seqQueue) pushFront(s *seq) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = s
	q.n++
}

func (q *seqQueue) front() *seq { return q.buf[q.head] }

func (q *seqQueue) popFront() *seq {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return s
}

func (q *seqQueue) remove(s *seq) {
	for i := range q.n {
		if q.buf[(q.head+i)%len(q.buf)] != s {
			continue
		}
		for j := i; j < q.n-1; j++ {
			q.buf[(q.head+j)%len(q.buf)] = q.buf[(q.head+j+1)%len(q.buf)]
		}
		q.buf[(q.head+q.n-1)%len(q.buf)] = nil
		q.n--
		return
	}
}
