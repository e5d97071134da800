package main

import "regexp"

func regexpMatch(pattern, s string) (bool, error) { return regexp.MatchString(pattern, s) }
