package admin

import (
	"encoding/json"
	"errors"
	"path/filepath"

	"github.com/valyala/fasthttp"

	"edgerelay/fastpath/httpx"
	"edgerelay/store"
)

// BackupPath is the endpoint of `edgerelay backup` against a running
// server:
//
//	POST /v1/backup   {"dir":"/abs/path"} → 201 store.BackupInfo
//
// The server writes a checkpoint of its store into dir, a path on its own
// machine (the admin listener is loopback): 400 for a relative path, 409
// for a directory that holds anything, 404 when the server has no store
// to back up (cluster mode keeps its state in NATS).
const BackupPath = "/v1/backup"

// BackupRequest is the body of POST /v1/backup.
type BackupRequest struct {
	Dir string `json:"dir"`
}

func (h *Handler) backup(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		backupError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if h.cfg.Backup == nil {
		backupError(ctx, fasthttp.StatusNotFound, "backup is off: this server keeps no store of its own (cluster mode keeps its state in NATS)")
		return
	}
	var req BackupRequest
	if json.Unmarshal(ctx.PostBody(), &req) != nil || req.Dir == "" {
		backupError(ctx, fasthttp.StatusBadRequest, `body must be {"dir":"/absolute/path"}`)
		return
	}
	if !filepath.IsAbs(req.Dir) {
		// The server's working directory is not the caller's.
		backupError(ctx, fasthttp.StatusBadRequest, "dir must be an absolute path")
		return
	}
	info, err := h.cfg.Backup(filepath.Clean(req.Dir))
	switch {
	case errors.Is(err, store.ErrNotEmpty):
		backupError(ctx, fasthttp.StatusConflict, err.Error())
	case err != nil:
		// The operator's own listener: the reason (a path, a permission)
		// is what they need, and it holds no secret.
		h.cfg.Log.Error("backup failed", "dir", req.Dir, "err", err)
		backupError(ctx, fasthttp.StatusInternalServerError, err.Error())
	default:
		h.cfg.Log.Info("backup written", "dir", info.Path, "files", info.Files, "bytes", info.Bytes, "version", info.Version)
		out, _ := json.Marshal(info)
		httpx.JSON(ctx, fasthttp.StatusCreated, out)
	}
}

// backupError is httpx.Error for messages that carry paths: encoded, as a
// path may hold a quote or a backslash.
func backupError(ctx *fasthttp.RequestCtx, status int, msg string) {
	out, _ := json.Marshal(map[string]string{"error": msg})
	httpx.JSON(ctx, status, out)
}
