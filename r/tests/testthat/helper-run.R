# The suite's sequences, each run once and shared by the test files:
# - the common path of docs/r.md, run as written (five analyses, all released, saved);
# - a sequence released, then withheld, with a third analysis never revealed;
# - a Kaplan-Meier curve by arm on the survival cohort.
.shared <- new.env()

# docs/r.md's first R block, with the test centre's address and key for the example's.
docs_block <- function() {
  docs <- readLines(file.path("..", "..", "..", "docs", "r.md"))
  start <- which(docs == "```r")[1]
  end <- start + which(docs[(start + 1):length(docs)] == "```")[1]
  docs[(start + 1):(end - 1)]
}

common_run <- function() {
  if (is.null(.shared$results)) {
    code <- sub('sa_connect("https://sac.example.org", "~/.safeaccess/keys/ada.key", "ada")',
                "sa_connect(centre$url, centre$key, centre$researcher)",
                paste(docs_block(), collapse = "\n"), fixed = TRUE)
    stopifnot(!grepl("sac.example.org", code, fixed = TRUE))
    folder <- file.path(tempdir(), "docs-run")
    dir.create(folder, showWarnings = FALSE)
    env <- new.env()
    withr::with_dir(folder, {
      .shared$printed <- utils::capture.output(
        .shared$value <- eval(parse(text = code), envir = env)
      )
    })
    .shared$results <- env$results
    .shared$sealed <- attr(env$results, "sealed")
    .shared$folder <- file.path(folder, "census-results")
  }
  .shared
}

withheld_run <- function() {
  if (is.null(.shared$withheld)) {
    plan <- sa_plan(session, "census") |>
      sa_frequency_table(~ sex) |>
      sa_frequency_table(~ ethnicity + region) |>
      sa_frequency_table(~ health + ethnicity)
    run <- list(plan = plan, rehearsal = sa_rehearse(plan, show = FALSE), seen = integer())
    run$sealed <- sa_seal(session, plan)
    run$sealed_file <- tempfile(fileext = ".json")
    sa_write_sealed(run$sealed, run$sealed_file)
    seen <- integer()
    run$results <- sa_run(session, run$sealed_file, on_step = function(step) {
      seen <<- c(seen, step$index)
    })
    run$seen <- seen
    .shared$withheld <- run
  }
  .shared$withheld
}

cohort_run <- function() {
  if (is.null(.shared$cohort)) {
    plan <- sa_plan(session, "cohort") |>
      sa_survival(Surv(days, died) ~ arm, interval = 90, max_time = 720)
    .shared$cohort_sealed <- sa_seal(session, plan)
    .shared$cohort <- sa_run(session, .shared$cohort_sealed)
  }
  .shared$cohort
}

cohort_sealed <- function() {
  cohort_run()
  .shared$cohort_sealed
}

# The cohort's records (the reference for the released curve), from the setup file's generator.
cohort_records <- function() {
  module <- reticulate::import_from_path("cohort_setup", ".", convert = FALSE)
  plain <- reticulate::py_eval(
    "lambda f: {'arm': f['arm'].astype(str).tolist(), 'days': f['days'].tolist(), 'died': f['died'].tolist()}"
  )
  as.data.frame(lapply(plain(module$cohort()), unlist), stringsAsFactors = FALSE)
}

# A released step's frame as Python's frame() gives it, with its named index levels as leading
# columns (reset_index): names and values, in Python.
python_frame <- function(step) {
  convert <- reticulate::py_run_string(paste(
    "def plain(result):",
    "    frame = result.frame()",
    "    named = all(n is not None for n in frame.index.names)",
    "    frame = frame.reset_index(drop=not named)",
    "    def cell(v):",
    "        if v is None or v != v:",
    "            return None",
    "        return v.item() if hasattr(v, 'item') else v",
    "    return {'names': [str(c) for c in frame.columns],",
    "            'values': [[cell(v) for v in frame[c].astype(object)] for c in frame.columns]}",
    sep = "\n"
  ))$plain
  convert(step$py)
}

# Two DP answers on census-dp (the centre's DP twin of the census).
dp_run <- function() {
  if (is.null(.shared$dp)) {
    plan <- sa_plan(session, "census-dp") |>
      sa_dp_count(by = "region", epsilon = 0.5, delta = 1e-7) |>
      sa_dp_mean(age ~ sex, epsilon = 0.5, delta = 1e-7)
    .shared$dp <- sa_run(session, sa_seal(session, plan))
  }
  .shared$dp
}
