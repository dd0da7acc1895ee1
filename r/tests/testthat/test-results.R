# Reading, saving, resuming and verifying from R: the results folder, receipts (signature and
# audit log) and the whole audit log.

statuses <- function(results) vapply(results, `[[`, "", "status")

test_that("the results folder is saved as the client saves it, and resuming rewrites it byte for byte", {
  run <- common_run()
  dir <- run$folder                                          # saved by the docs' common path
  files <- sort(list.files(dir, recursive = TRUE))
  expect_true(all(c("README.md", "sealed.json", "summary.json", "receipts/01.json",
                    "receipts/05.json", "steps/01-frequency_table.csv",
                    "steps/03-regression.json") %in% files))
  withheld <- file.path(tempdir(), "withheld-results")
  expect_equal(sa_save(withheld_run()$results, withheld), withheld)
  expect_true(file.exists(file.path(withheld, "receipts", "02.json")))
  expect_false(any(startsWith(list.files(withheld, recursive = TRUE), "steps/02")))
  csv <- utils::read.csv(file.path(dir, "steps/01-frequency_table.csv"), check.names = FALSE)
  frame <- as.data.frame(run$results[[1]])
  expect_equal(csv$F, frame$F)
  expect_equal(csv$region, frame$region)
  before <- tools::md5sum(file.path(dir, files))

  opened <- nrow(sa_sequences(session))
  again <- sa_resume(session, dir)                           # from the folder's sealed.json
  expect_equal(statuses(again), statuses(run$results))
  expect_equal(again[[3]]$output, run$results[[3]]$output)
  expect_equal(nrow(sa_sequences(session)), opened)          # never opened twice
  sa_save(again, dir)
  expect_equal(tools::md5sum(file.path(dir, files)), before)
  withheld <- withheld_run()
  expect_equal(statuses(sa_resume(session, withheld$sealed_file)), statuses(withheld$results))
})

test_that("a folder holding another sequence's results is refused with the client's error", {
  dir <- common_run()$folder
  summary <- tools::md5sum(file.path(dir, "summary.json"))
  err <- tryCatch(sa_save(cohort_run(), dir), error = identity)
  expect_s3_class(err, "safeaccess_ResultsFolderError")
  expect_match(conditionMessage(err), common_run()$results[[1]]$sequence_id, fixed = TRUE)
  expect_equal(tools::md5sum(file.path(dir, "summary.json")), summary)
})

test_that("sa_resume with a sequence id resumes from the client's journal", {
  run <- common_run()
  id <- run$results[[1]]$sequence_id
  expect_equal(statuses(sa_resume(session, id)), statuses(run$results))
  expect_error(sa_resume(session, "no-such-sequence"), class = "safeaccess_error")
})

test_that("receipts verify from R: the centre's signature, and the audit log's entry", {
  run <- common_run()
  expect_true(sa_verify_receipt(session, run$results[[1]], run$sealed))
  withheld <- withheld_run()
  expect_true(sa_verify_receipt(session, withheld$results[[2]], withheld$sealed))
  err <- tryCatch(sa_verify_receipt(session, run$results[[1]], cohort_sealed()), error = identity)
  expect_s3_class(err, "safeaccess_ReceiptInvalid")
  expect_match(conditionMessage(err), "does not match what was received: body_sha256",
               fixed = TRUE)

  released <- sa_check_receipt(session, run$results[[2]])
  expect_equal(released$step, 2L)
  expect_equal(released$state, "released")
  expect_true(released$output_checked)
  checked <- sa_check_receipt(session, withheld$results[[2]])
  expect_equal(checked$state, "withheld")
  expect_false(checked$output_checked)
  expect_output(print(released), "^OK: step 2 of sequence .* is released at log entry")
})

test_that("a saved receipt whose output was altered fails the log check", {
  saved <- file.path(common_run()$folder, "receipts", "01.json")
  expect_equal(sa_check_receipt(session, saved)$state, "released")
  altered <- tempfile(fileext = ".json")
  reticulate::py_run_string(paste(
    "import json",
    sprintf("data = json.load(open(%s))", deparse(saved)),
    "data['output']['values'][0][0] += 1",
    sprintf("json.dump(data, open(%s, 'w'))", deparse(altered)),
    sep = "\n"
  ))
  err <- tryCatch(sa_check_receipt(session, altered), error = identity)
  expect_s3_class(err, "safeaccess_AuditFailure")
  expect_no_match(conditionMessage(err), "Traceback")
})

test_that("the audit log verifies from R, extends its checkpoint, and refuses another key", {
  common_run()
  checkpoint <- tempfile()
  report <- sa_audit_verify(centre$url, centre$auditor_key, centre$auditor,
                            save_checkpoint = checkpoint)
  expect_s3_class(report, "sa_audit_report")
  expect_equal(paste(readLines(checkpoint), collapse = "\n"), sub("\n$", "", report$checkpoint))
  expect_true(length(report$lines) > 0)
  expect_output(print(report), "OK: the log verifies")
  again <- sa_audit_verify(centre$url, centre$auditor_key, centre$auditor,
                           trusted_checkpoint = checkpoint)
  expect_equal(again$server_id, report$server_id)
  err <- tryCatch(
    sa_audit_verify(centre$url, centre$auditor_key, centre$auditor,
                    server_key = sub("\\.key$", ".pub", centre$key)),
    error = identity
  )
  expect_s3_class(err, "safeaccess_AuditFailure")
})

test_that("a pinned centre key that the server does not announce stops the run before a reveal", {
  withheld <- withheld_run()
  pinned <- sa_connect(centre$url, centre$key, centre$researcher,
                       server_key = sub("\\.key$", ".pub", centre$key))
  opened <- nrow(sa_sequences(session))
  err <- tryCatch(sa_run(pinned, sa_read_sealed(withheld$sealed_file)), error = identity)
  expect_s3_class(err, "safeaccess_WrongServer")
  expect_match(conditionMessage(err), "announces a different signing key", fixed = TRUE)
  expect_equal(nrow(sa_sequences(session)), opened)
})
