package cli

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
)

// modulePath is the module the tool belongs to.
const modulePath = "github.com/sqlease/sqlease"

// versionJSON is the object `sqlease version --json` prints. Fields that
// are not known are empty, never left out.
type versionJSON struct {
	Module     string `json:"module"`      // github.com/sqlease/sqlease
	Version    string `json:"version"`     // module version, or "(devel)"
	Commit     string `json:"commit"`      // VCS revision, "" when not recorded
	CommitTime string `json:"commit_time"` // RFC 3339, "" when not recorded
	Modified   bool   `json:"modified"`    // the work tree had uncommitted changes
	Go         string `json:"go"`          // Go version the binary was built with
	Main       string `json:"main"`        // the main module (another one when the CLI is imported)
}

// buildInfo reads the version from the binary's build information.
var buildInfo = debug.ReadBuildInfo

// readVersion reports the sqlease module's version and, when sqlease is
// the main module, the VCS stamp of the build.
func readVersion() versionJSON {
	v := versionJSON{Module: modulePath, Version: "(devel)", Go: runtime.Version()}
	bi, ok := buildInfo()
	if !ok {
		return v
	}
	v.Main = bi.Main.Path
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	mod := &bi.Main
	if bi.Main.Path != modulePath {
		mod = nil
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				mod = d
				if d.Replace != nil {
					mod = d.Replace
				}
			}
		}
	}
	if mod != nil && mod.Version != "" {
		v.Version = mod.Version
	}
	// VCS settings describe the main module's checkout only.
	if bi.Main.Path == modulePath {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.time":
				v.CommitTime = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	return v
}

func setupVersion(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var asJSON bool
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	return func(ctx context.Context, args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		v := readVersion()
		if asJSON {
			return writeJSON(out.stdout, v)
		}
		fmt.Fprintf(out.stdout, "sqlease %s\n", v.Version)
		fmt.Fprintf(out.stdout, "module  %s\n", v.Module)
		switch {
		case v.Commit != "":
			extra := v.CommitTime
			if v.Modified {
				extra += ", modified"
			}
			fmt.Fprintf(out.stdout, "commit  %s (%s)\n", v.Commit, extra)
		case v.Main != "" && v.Main != modulePath:
			fmt.Fprintf(out.stdout, "commit  unknown (built into %s; its version above)\n", v.Main)
		default:
			fmt.Fprintf(out.stdout, "commit  unknown (not recorded: go run, go test or -buildvcs=false)\n")
		}
		fmt.Fprintf(out.stdout, "go      %s\n", v.Go)
		return nil
	}
}
