package live

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// buildBinaries builds cmd/warmpath and cmd/enginesim into dir with the go
// tool, from the module that contains the working directory.
func buildBinaries(ctx context.Context, dir string) (warmpath, enginesim string, err error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", "", errors.New("build: no go tool in PATH; pass Options.WarmpathBin and Options.EnginesimBin")
	}
	warmpath, enginesim = filepath.Join(dir, "warmpath"), filepath.Join(dir, "enginesim")
	for _, b := range []struct{ out, pkg string }{
		{warmpath, "github.com/warmpath/warmpath/cmd/warmpath"},
		{enginesim, "github.com/warmpath/warmpath/cmd/enginesim"},
	} {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", b.out, b.pkg)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return "", "", fmt.Errorf("go build %s (run inside the warmpath module, or pass the binary paths): %w: %s", b.pkg, err, out)
		}
	}
	return warmpath, enginesim, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
