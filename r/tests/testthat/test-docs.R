# docs/r.md's common path in R runs as written against the centre (its address and key
# replaced by the test centre's), in at most 12 lines.

test_that("the common path of docs/r.md runs and saves its results folder", {
  docs <- readLines(file.path("..", "..", "..", "docs", "r.md"))
  start <- which(docs == "```r")[1]
  end <- start + which(docs[(start + 1):length(docs)] == "```")[1]
  block <- docs[(start + 1):(end - 1)]
  expect_lte(length(block), 12)
  code <- sub('sa_connect("https://sac.example.org", "~/.safeaccess/keys/ada.key", "ada")',
              "sa_connect(centre$url, centre$key, centre$researcher)", paste(block, collapse = "\n"),
              fixed = TRUE)
  expect_false(grepl("sac.example.org", code, fixed = TRUE))
  folder <- file.path(tempdir(), "docs-run")
  dir.create(folder)
  coefficients <- withr::with_dir(folder, {
    utils::capture.output(value <- eval(parse(text = code), envir = new.env()))
    value
  })
  expect_equal(coefficients$term, c("Intercept", "C(sex)[T.M]", "age"))
  summary <- file.path(folder, "census-results", "summary.json")
  expect_true(file.exists(summary))
  expect_match(paste(readLines(summary), collapse = ""), '"outcome": "finished: all 5 steps released"',
               fixed = TRUE)
})
