package slowpath

import (
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"
)

// scrapeSize turns a scrape whose body went over scrape.body_size_limit
// into its own error, counts it and logs it once until a scrape of the
// replica succeeds again; other errors pass through.
func (s *Server) scrapeSize(r *replica, err error) error {
	if !errors.Is(err, fasthttp.ErrBodyTooLarge) {
		if err == nil && r.scrapeBig.CompareAndSwap(true, false) {
			r.log.Info("engine metrics body back under scrape.body_size_limit")
		}
		return err
	}
	r.m.scrapeBig.Inc()
	if r.scrapeBig.CompareAndSwap(false, true) {
		r.log.Warn("engine metrics body over scrape.body_size_limit: scrape refused", "limit", s.cfg.Scrape.BodySizeLimit)
	}
	return fmt.Errorf("metrics body over scrape.body_size_limit (%d bytes)", s.cfg.Scrape.BodySizeLimit)
}
