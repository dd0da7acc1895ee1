# R CMD check's entry point; the repository's pytest wrapper (tests/r/) runs test_dir itself.
library(testthat)
library(safeaccess)
test_check("safeaccess")
