# One demo centre for the whole suite (the embedded defaults of `safeaccess-server demo`:
# SQLite, the process sandbox), with a small census and the survival cohort; stopped at the end.
if (Sys.getenv("RETICULATE_PYTHON") == "") {
  # The repository's .venv (scripts/setup), three levels above r/tests/testthat.
  venv <- file.path("..", "..", "..", ".venv", "bin", "python")
  if (file.exists(venv)) Sys.setenv(RETICULATE_PYTHON = normalizePath(venv))
}
library(safeaccess)

ROWS <- 3000
centre <- sa_demo_centre(rows = ROWS, setup = "cohort_setup.py")
withr::defer(sa_stop_centre(centre), teardown_env())
session <- sa_connect(centre$url, centre$key, centre$researcher)

# The generated census the centre holds (the reference for released numbers; a researcher
# never has it), from the same generator and seed as the centre's.
census <- local({
  data <- reticulate::import("safeaccess.server.demo.data", convert = FALSE)
  frame <- data$generate_census(as.integer(ROWS))$drop(columns = "employer_id")
  plain <- reticulate::py_eval(
    "lambda f: {c: (f[c].astype(str) if f[c].dtype == 'category' else f[c]).tolist() for c in f.columns}"
  )
  as.data.frame(lapply(plain(frame), unlist), stringsAsFactors = FALSE)
})
