package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	"mesh/cluster"
	"mesh/state"
)

// A node's data dir is made once, before its agent first runs: by Init
// for the first node of a mesh, by Join for every other, and remade by
// Recover when the majority of voters is gone for good. They are the
// cluster package's; the CLI reaches them here, through the node.
type (
	// InitConfig is what mesh init makes a mesh from.
	InitConfig = cluster.InitConfig
	// JoinConfig is what mesh join joins with.
	JoinConfig = cluster.JoinConfig
	// RecoverResult is what mesh recover did.
	RecoverResult = cluster.RecoverResult
)

// Init creates a mesh with this machine as its first node, once the
// overlay it asks for is known not to overlap the host's networks.
func Init(ctx context.Context, cfg InitConfig) error {
	if cfg.Overlay == "" {
		cfg.Overlay = state.DefaultOverlay
	}
	if _, err := cluster.ReadIdentity(cfg.DataDir); err == nil {
		return cluster.Init(ctx, cfg) // which says the data dir is taken
	}
	if err := CheckOverlay(cfg.Overlay); err != nil {
		return err
	}
	return cluster.Init(ctx, cfg)
}

// Join joins this machine to a mesh through any of its nodes.
func Join(ctx context.Context, cfg JoinConfig) error { return cluster.Join(ctx, cfg) }

// Recover makes the node of dataDir, its agent stopped, the only voter.
func Recover(ctx context.Context, dataDir string) (RecoverResult, error) {
	return cluster.Recover(ctx, dataDir)
}

// EnvDir is where the agent of dataDir keeps the environment of its
// containers with env-secrets (what a bed removes after itself).
func EnvDir(dataDir string) string { return envDir(dataDir) }

// envDir is where the reconciler keeps the environment of the containers
// with env-secrets: on the runtime tmpfs (/run for root, the user's
// $XDG_RUNTIME_DIR otherwise), never on disk, one directory per data dir
// (two agents on one host never share it). "" when a rootless agent has no
// runtime directory: such a container then fails, saying so.
func envDir(dataDir string) string {
	base := "/run"
	if os.Geteuid() != 0 {
		base = os.Getenv("XDG_RUNTIME_DIR")
		if base == "" {
			return ""
		}
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	h := sha256.Sum256([]byte(abs))
	return filepath.Join(base, "mesh", hex.EncodeToString(h[:6]), "env")
}
