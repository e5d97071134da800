package turntest

import "github.com/pion/logging"

// quiet discards the pion client's log lines.
type quiet struct{}

func (quiet) NewLogger(string) logging.LeveledLogger { return quiet{} }
func (quiet) Trace(string)                           {}
func (quiet) Tracef(string, ...any)                  {}
func (quiet) Debug(string)                           {}
func (quiet) Debugf(string, ...any)                  {}
func (quiet) Info(string)                            {}
func (quiet) Infof(string, ...any)                   {}
func (quiet) Warn(string)                            {}
func (quiet) Warnf(string, ...any)                   {}
func (quiet) Error(string)                           {}
func (quiet) Errorf(string, ...any)                  {}
