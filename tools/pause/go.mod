// Builds the pause program: the sandbox container of the local cluster's real nodes (not product code).
module faultline.local/tools/pause

go 1.26.0
